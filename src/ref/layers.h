// Reference tier: plain loops, every sum accumulated in double. Templated on the storage
// type T (double in the tests, float in `check`). The fast tier (src/cpu/layers.h) has the
// same functions with the same arguments and is tested against this one.
//
// Contract shared by both tiers:
//  - argument order: outputs, saved stats, inputs, weights, sizes;
//  - forward saves only what backward needs;
//  - backward OVERWRITES activation gradients and ADDS INTO parameter gradients
//    (so tied weights and accumulation need no special case).
// Sizes: B batch, T time, C model dim, H query heads, KVH kv heads, D head dim,
// F ffn dim, V vocab, N = B*T token rows.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace tq::ref {

template <typename T>
void embedding_forward(T* out /*[N,C]*/, const int32_t* tokens /*[N]*/, const T* E /*[V,C]*/,
                       int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = E[tokens[n] * C + c];
}
template <typename T>
void embedding_backward(T* dE /*[V,C]*/, const T* dout /*[N,C]*/, const int32_t* tokens, int64_t N,
                        int64_t C) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) dE[tokens[n] * C + c] += dout[n * C + c];
}

template <typename T>
void rmsnorm_forward(T* out /*[N,C]*/, T* rstd /*[N]*/, const T* x /*[N,C]*/, const T* w /*[C]*/,
                     int64_t N, int64_t C, double eps) {
#pragma omp parallel for
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(xr[c]) * xr[c];
    const double r = 1.0 / std::sqrt(ss / C + eps);
    rstd[n] = T(r);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = T(xr[c] * r * w[c]);
  }
}
template <typename T>
void rmsnorm_backward(T* dx /*[N,C]*/, T* dw /*[C]*/, const T* dout /*[N,C]*/, const T* x,
                      const T* rstd /*[N]*/, const T* w /*[C]*/, int64_t N, int64_t C) {
  std::vector<double> dwacc(C, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const T *xr = x + n * C, *g = dout + n * C;
    const double r = rstd[n];
    double dot = 0;  // sum_c (g*w) * xhat
    for (int64_t c = 0; c < C; ++c) {
      dot += double(g[c]) * w[c] * xr[c] * r;
      dwacc[c] += double(g[c]) * xr[c] * r;
    }
    for (int64_t c = 0; c < C; ++c)
      dx[n * C + c] = T(r * (double(g[c]) * w[c] - xr[c] * r * dot / C));
  }
  for (int64_t c = 0; c < C; ++c) dw[c] += T(dwacc[c]);
}

template <typename T>
void matmul_forward(T* out /*[N,OC]*/, const T* x /*[N,IC]*/, const T* W /*[OC,IC]*/, int64_t N,
                    int64_t IC, int64_t OC) {
#pragma omp parallel for collapse(2)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = 0;
      for (int64_t i = 0; i < IC; ++i) s += double(x[n * IC + i]) * W[o * IC + i];
      out[n * OC + o] = T(s);
    }
}
template <typename T>
void matmul_backward(T* dx /*[N,IC]*/, T* dW /*[OC,IC]*/, const T* dout /*[N,OC]*/,
                     const T* x /*[N,IC]*/, const T* W /*[OC,IC]*/, int64_t N, int64_t IC,
                     int64_t OC) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < IC; ++i) {
      double s = 0;
      for (int64_t o = 0; o < OC; ++o) s += double(dout[n * OC + o]) * W[o * IC + i];
      dx[n * IC + i] = T(s);
    }
  for (int64_t o = 0; o < OC; ++o)
    for (int64_t i = 0; i < IC; ++i) {
      double s = 0;
      for (int64_t n = 0; n < N; ++n) s += double(dout[n * OC + o]) * x[n * IC + i];
      dW[o * IC + i] += T(s);
    }
}

// Fused qkv rows (spec §3) -> head-major q, k, v.
template <typename T>
void qkv_split_forward(T* q /*[N,H,D]*/, T* k /*[N,KVH,D]*/, T* v /*[N,KVH,D]*/,
                       const T* qkv /*[N,(H+2KVH)*D]*/, int64_t N, int64_t H, int64_t KVH,
                       int64_t D) {
  const int64_t G = H / KVH, R = (H + 2 * KVH) * D;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < KVH; ++g)
      for (int64_t s = 0; s < G + 2; ++s)
        for (int64_t e = 0; e < D; ++e) {
          const T val = qkv[n * R + (g * (G + 2) + s) * D + e];
          if (s < G)
            q[(n * H + g * G + s) * D + e] = val;
          else if (s == G)
            k[(n * KVH + g) * D + e] = val;
          else
            v[(n * KVH + g) * D + e] = val;
        }
}
template <typename T>
void qkv_split_backward(T* dqkv /*[N,(H+2KVH)*D]*/, const T* dq, const T* dk, const T* dv,
                        int64_t N, int64_t H, int64_t KVH, int64_t D) {
  const int64_t G = H / KVH, R = (H + 2 * KVH) * D;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < KVH; ++g)
      for (int64_t s = 0; s < G + 2; ++s)
        for (int64_t e = 0; e < D; ++e) {
          T& o = dqkv[n * R + (g * (G + 2) + s) * D + e];
          if (s < G)
            o = dq[(n * H + g * G + s) * D + e];
          else if (s == G)
            o = dk[(n * KVH + g) * D + e];
          else
            o = dv[(n * KVH + g) * D + e];
        }
}

// Rotate-half RoPE at positions t = 0..T-1 of every sequence, or with doc [B*T] (block-causal
// attention: doc[b*T + t] the first token of t's document) at t - doc[b*T + t], each document's
// from 0; sign -1 applies the transposed rotation (the backward). out may alias x.
template <typename T>
void rope_rotate(T* out, const T* x, const float* cos, const float* sin, int64_t B, int64_t Tn,
                 int64_t NH, int64_t D, double sign, const int32_t* doc) {
  const int64_t D2 = D / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tn; ++t)
      for (int64_t h = 0; h < NH; ++h) {
        const int64_t base = ((b * Tn + t) * NH + h) * D, p = doc ? t - doc[b * Tn + t] : t;
        for (int64_t e = 0; e < D2; ++e) {
          const double c = cos[p * D2 + e], s = sign * sin[p * D2 + e];
          const double x1 = x[base + e], x2 = x[base + e + D2];
          out[base + e] = T(x1 * c - x2 * s);
          out[base + e + D2] = T(x2 * c + x1 * s);
        }
      }
}
template <typename T>
void rope_forward(T* out /*[B,T,NH,D]*/, const T* x /*[B,T,NH,D]*/, const float* cos /*[T,D/2]*/,
                  const float* sin /*[T,D/2]*/, int64_t B, int64_t Tn, int64_t NH, int64_t D,
                  const int32_t* doc /*[B*T] or null*/ = nullptr) {
  rope_rotate(out, x, cos, sin, B, Tn, NH, D, 1.0, doc);
}
template <typename T>
void rope_backward(T* dx, const T* dout, const float* cos, const float* sin, int64_t B, int64_t Tn,
                   int64_t NH, int64_t D, const int32_t* doc = nullptr) {
  rope_rotate(dx, dout, cos, sin, B, Tn, NH, D, -1.0, doc);
}

// Causal GQA attention per sequence; query head h reads kv head h / (H/KVH). Query i sees keys
// 0..i, or with doc [B*T] (block-causal) keys doc[b*T + i]..i, its own document's.
// Saves lse (log-sum-exp of the scaled scores) so backward can rebuild P.
template <typename T>
void attention_forward(T* out /*[B,T,H,D]*/, T* lse /*[B,H,T]*/, const T* q /*[B,T,H,D]*/,
                       const T* k /*[B,T,KVH,D]*/, const T* v /*[B,T,KVH,D]*/, int64_t B,
                       int64_t Tn, int64_t H, int64_t KVH, int64_t D,
                       const int32_t* doc /*[B*T] or null*/ = nullptr) {
  const int64_t G = H / KVH;
  const double scale = 1.0 / std::sqrt(double(D));
#pragma omp parallel for collapse(2)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> p(Tn), o(D);
      for (int64_t i = 0; i < Tn; ++i) {
        const T* qi = q + ((b * Tn + i) * H + h) * D;
        const int64_t j0 = doc ? doc[b * Tn + i] : 0;
        double mx = -INFINITY;
        for (int64_t j = j0; j <= i; ++j) {
          const T* kj = k + ((b * Tn + j) * KVH + h / G) * D;
          double s = 0;
          for (int64_t e = 0; e < D; ++e) s += double(qi[e]) * kj[e];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int64_t j = j0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t j = j0; j <= i; ++j) {
          const T* vj = v + ((b * Tn + j) * KVH + h / G) * D;
          for (int64_t e = 0; e < D; ++e) o[e] += p[j] / sum * vj[e];
        }
        for (int64_t e = 0; e < D; ++e) out[((b * Tn + i) * H + h) * D + e] = T(o[e]);
        lse[(b * H + h) * Tn + i] = T(mx + std::log(sum));
      }
    }
}
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout /*[B,T,H,D]*/, const T* out,
                        const T* lse, const T* q, const T* k, const T* v, int64_t B, int64_t Tn,
                        int64_t H, int64_t KVH, int64_t D, const int32_t* doc = nullptr) {
  const int64_t G = H / KVH;
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> dkacc(B * Tn * KVH * D, 0.0), dvacc(dkacc.size(), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tn; ++i) {
        const int64_t qi = ((b * Tn + i) * H + h) * D;
        double di = 0;  // rowsum(dP*P) == dO_i . O_i
        for (int64_t e = 0; e < D; ++e) di += double(dout[qi + e]) * out[qi + e];
        std::vector<double> dqi(D, 0.0);
        for (int64_t j = doc ? doc[b * Tn + i] : 0; j <= i; ++j) {
          const int64_t kj = ((b * Tn + j) * KVH + h / G) * D;
          double s = 0, dp = 0;
          for (int64_t e = 0; e < D; ++e) {
            s += double(q[qi + e]) * k[kj + e];
            dp += double(dout[qi + e]) * v[kj + e];
          }
          const double p = std::exp(s * scale - double(lse[(b * H + h) * Tn + i]));
          const double ds = p * (dp - di) * scale;
          for (int64_t e = 0; e < D; ++e) {
            dqi[e] += ds * k[kj + e];
            dkacc[kj + e] += ds * q[qi + e];
            dvacc[kj + e] += p * dout[qi + e];
          }
        }
        for (int64_t e = 0; e < D; ++e) dq[qi + e] = T(dqi[e]);
      }
  for (size_t i = 0; i < dkacc.size(); ++i) dk[i] = T(dkacc[i]), dv[i] = T(dvacc[i]);
}

// SwiGLU on a fused [N, 2F] input: a = columns [0,F) (gate, w1), b = [F,2F) (up, w3).
template <typename T>
void swiglu_forward(T* out /*[N,F]*/, const T* ab /*[N,2F]*/, int64_t N, int64_t F) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      const double a = ab[n * 2 * F + f], b = ab[n * 2 * F + F + f];
      out[n * F + f] = T(a / (1.0 + std::exp(-a)) * b);
    }
}
template <typename T>
void swiglu_backward(T* dab /*[N,2F]*/, const T* dout /*[N,F]*/, const T* ab, int64_t N,
                     int64_t F) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      const double a = ab[n * 2 * F + f], b = ab[n * 2 * F + F + f], g = dout[n * F + f];
      const double sg = 1.0 / (1.0 + std::exp(-a));
      dab[n * 2 * F + f] = T(g * b * sg * (1.0 + a * (1.0 - sg)));
      dab[n * 2 * F + F + f] = T(g * a * sg);
    }
}

// Mean cross-entropy over N rows through an explicit log-softmax; returns the loss.
template <typename T>
double crossentropy_forward(T* lse /*[N]*/, const T* logits /*[N,V]*/, const int32_t* targets,
                            int64_t N, int64_t V) {
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    const T* row = logits + n * V;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(row[j]));
    for (int64_t j = 0; j < V; ++j) sum += std::exp(double(row[j]) - mx);
    const double l = mx + std::log(sum);
    lse[n] = T(l);
    total += l - row[targets[n]];
  }
  return total / N;
}
// dlogits = (softmax - onehot) * scale; dlogits may alias logits.
template <typename T>
void crossentropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* targets,
                           int64_t N, int64_t V, double scale) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < V; ++j) {
      const double p = std::exp(double(logits[n * V + j]) - double(lse[n]));
      dlogits[n * V + j] = T((p - (j == targets[n] ? 1.0 : 0.0)) * scale);
    }
}

}  // namespace tq::ref
