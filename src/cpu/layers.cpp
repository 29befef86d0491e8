#include "cpu/layers.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/common.h"

namespace tq::cpu {

static int g_threads = 1;

void set_threads(int n) {
  g_threads = std::max(1, n);
  omp_set_num_threads(g_threads);
  openblas_set_num_threads(g_threads);
}
int threads() {
  return g_threads;
}

void embedding_forward(float* out, const int32_t* tokens, const float* E, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) std::memcpy(out + n * C, E + tokens[n] * C, C * sizeof(float));
}
void embedding_backward(float* dE, const float* dout, const int32_t* tokens, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {  // serial: tokens may repeat
    float* row = dE + tokens[n] * C;
    const float* g = dout + n * C;
    for (int64_t c = 0; c < C; ++c) row[c] += g[c];
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C,
                     double eps) {
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    float ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const float r = 1.0f / std::sqrt(ss / C + float(eps));
    rstd[n] = r;
    float* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) o[c] = xr[c] * r * w[c];
  }
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* rstd,
                      const float* w, int64_t N, int64_t C) {
  const int nt = omp_get_max_threads();
  std::vector<float> dwpart(size_t(nt) * C, 0.0f);  // per-thread dw, summed in thread order
#pragma omp parallel if (N * C > 16384)
  {
    float* mydw = dwpart.data() + size_t(omp_get_thread_num()) * C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float *xr = x + n * C, *g = dout + n * C;
      const float r = rstd[n];
      float dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        dot += g[c] * w[c] * xr[c];
        mydw[c] += g[c] * xr[c] * r;
      }
      dot *= r;
      float* d = dx + n * C;
      for (int64_t c = 0; c < C; ++c) d[c] = r * (g[c] * w[c] - xr[c] * r * dot / C);
    }
  }
  for (int t = 0; t < nt; ++t)
    for (int64_t c = 0; c < C; ++c) dw[c] += dwpart[size_t(t) * C + c];
}

void matmul_forward(float* out, const float* x, const float* W, int64_t N, int64_t IC, int64_t OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, x, IC, W, IC, 0.0f, out,
              OC);
}
void matmul_backward(float* dx, float* dW, const float* dout, const float* x, const float* W,
                     int64_t N, int64_t IC, int64_t OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, W, IC, 0.0f, dx,
              IC);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, x, IC, 1.0f, dW,
              IC);
}

void qkv_split_forward(float* q, float* k, float* v, const float* qkv, int64_t N, int64_t H,
                       int64_t KVH, int64_t D) {
  const int64_t G = H / KVH, R = (H + 2 * KVH) * D;
#pragma omp parallel for schedule(static) if (N * R > 65536)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < KVH; ++g) {
      const float* src = qkv + n * R + g * (G + 2) * D;
      std::memcpy(q + (n * H + g * G) * D, src, G * D * sizeof(float));
      std::memcpy(k + (n * KVH + g) * D, src + G * D, D * sizeof(float));
      std::memcpy(v + (n * KVH + g) * D, src + (G + 1) * D, D * sizeof(float));
    }
}
void qkv_split_backward(float* dqkv, const float* dq, const float* dk, const float* dv, int64_t N,
                        int64_t H, int64_t KVH, int64_t D) {
  const int64_t G = H / KVH, R = (H + 2 * KVH) * D;
#pragma omp parallel for schedule(static) if (N * R > 65536)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < KVH; ++g) {
      float* dst = dqkv + n * R + g * (G + 2) * D;
      std::memcpy(dst, dq + (n * H + g * G) * D, G * D * sizeof(float));
      std::memcpy(dst + G * D, dk + (n * KVH + g) * D, D * sizeof(float));
      std::memcpy(dst + (G + 1) * D, dv + (n * KVH + g) * D, D * sizeof(float));
    }
}

// sign = +1: forward rotation; -1: its transpose (backward).
static void rope_apply(float* out, const float* x, const float* cos, const float* sin, int64_t B,
                       int64_t T, int64_t NH, int64_t D, float sign) {
  const int64_t D2 = D / 2;
#pragma omp parallel for collapse(2) schedule(static) if (B * T * NH * D > 65536)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float *c = cos + t * D2, *s = sin + t * D2;
      for (int64_t h = 0; h < NH; ++h) {
        const int64_t base = ((b * T + t) * NH + h) * D;
        const float* xi = x + base;
        float* o = out + base;
        for (int64_t e = 0; e < D2; ++e) {
          const float x1 = xi[e], x2 = xi[e + D2], se = sign * s[e];
          o[e] = x1 * c[e] - x2 * se;
          o[e + D2] = x2 * c[e] + x1 * se;
        }
      }
    }
}
void rope_forward(float* out, const float* x, const float* cos, const float* sin, int64_t B,
                  int64_t T, int64_t NH, int64_t D) {
  rope_apply(out, x, cos, sin, B, T, NH, D, 1.0f);
}
void rope_backward(float* dx, const float* dout, const float* cos, const float* sin, int64_t B,
                   int64_t T, int64_t NH, int64_t D) {
  rope_apply(dx, dout, cos, sin, B, T, NH, D, -1.0f);
}

static inline float dot(const float* a, const float* b, int64_t D) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t e = 0; e < D; ++e) s += a[e] * b[e];
  return s;
}

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D) {
  const int64_t G = H / KVH;
  const float scale = 1.0f / std::sqrt(float(D));
#pragma omp parallel
  {
    std::vector<float> p(T);
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const float* kb = k + (b * T * KVH + h / G) * D;  // row j at kb + j*KVH*D
        const float* vb = v + (b * T * KVH + h / G) * D;
        for (int64_t i = 0; i < T; ++i) {
          const float* qi = q + ((b * T + i) * H + h) * D;
          float mx = -INFINITY;
          for (int64_t j = 0; j <= i; ++j) {
            p[j] = dot(qi, kb + j * KVH * D, D) * scale;
            mx = std::max(mx, p[j]);
          }
          float sum = 0;
          for (int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
          const float inv = 1.0f / sum;
          float* o = out + ((b * T + i) * H + h) * D;
          std::fill(o, o + D, 0.0f);
          for (int64_t j = 0; j <= i; ++j) {
            const float pj = p[j] * inv;
            const float* vj = vb + j * KVH * D;
#pragma omp simd
            for (int64_t e = 0; e < D; ++e) o[e] += pj * vj[e];
          }
          lse[(b * H + h) * T + i] = mx + std::log(sum);
        }
      }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v, int64_t B,
                        int64_t T, int64_t H, int64_t KVH, int64_t D) {
  const int64_t G = H / KVH;
  const float scale = 1.0f / std::sqrt(float(D));
  // One task per (sequence, kv head): it owns that head's dk/dv rows, so no races.
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < KVH; ++g) {
      for (int64_t j = 0; j < T; ++j) {
        std::fill_n(dk + ((b * T + j) * KVH + g) * D, D, 0.0f);
        std::fill_n(dv + ((b * T + j) * KVH + g) * D, D, 0.0f);
      }
      for (int64_t h = g * G; h < (g + 1) * G; ++h)
        for (int64_t i = 0; i < T; ++i) {
          const int64_t qi = ((b * T + i) * H + h) * D;
          const float di = dot(dout + qi, out + qi, D);
          const float l = lse[(b * H + h) * T + i];
          float* dqi = dq + qi;
          std::fill(dqi, dqi + D, 0.0f);
          for (int64_t j = 0; j <= i; ++j) {
            const int64_t kj = ((b * T + j) * KVH + g) * D;
            const float p = std::exp(dot(q + qi, k + kj, D) * scale - l);
            const float ds = p * (dot(dout + qi, v + kj, D) - di) * scale;
            float *dkj = dk + kj, *dvj = dv + kj;
            const float *kr = k + kj, *qr = q + qi, *go = dout + qi;
#pragma omp simd
            for (int64_t e = 0; e < D; ++e) {
              dqi[e] += ds * kr[e];
              dkj[e] += ds * qr[e];
              dvj[e] += p * go[e];
            }
          }
        }
    }
}

void swiglu_forward(float* out, const float* ab, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if (N * F > 16384)
  for (int64_t n = 0; n < N; ++n) {
    const float *a = ab + n * 2 * F, *b = a + F;
    float* o = out + n * F;
    for (int64_t f = 0; f < F; ++f) o[f] = a[f] / (1.0f + std::exp(-a[f])) * b[f];
  }
}
void swiglu_backward(float* dab, const float* dout, const float* ab, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if (N * F > 16384)
  for (int64_t n = 0; n < N; ++n) {
    const float *a = ab + n * 2 * F, *b = a + F, *g = dout + n * F;
    float *da = dab + n * 2 * F, *db = da + F;
    for (int64_t f = 0; f < F; ++f) {
      const float sg = 1.0f / (1.0f + std::exp(-a[f]));
      da[f] = g[f] * b[f] * sg * (1.0f + a[f] * (1.0f - sg));
      db[f] = g[f] * a[f] * sg;
    }
  }
}

double crossentropy_forward(float* lse, const float* logits, const int32_t* targets, int64_t N,
                            int64_t V) {
  std::vector<double> per_row(N);
#pragma omp parallel for schedule(static) if (N * V > 65536)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = logits + n * V;
    float mx = -INFINITY;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, row[j]);
    float sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(row[j] - mx);
    lse[n] = mx + std::log(sum);
    per_row[n] = double(lse[n]) - double(row[targets[n]]);
  }
  double total = 0;  // fixed order: reproducible for any thread count
  for (int64_t n = 0; n < N; ++n) total += per_row[n];
  return total / N;
}
void crossentropy_backward(float* dlogits, const float* logits, const float* lse,
                           const int32_t* targets, int64_t N, int64_t V, double scale) {
  const float s = float(scale);
#pragma omp parallel for schedule(static) if (N * V > 65536)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = logits + n * V;
    float* d = dlogits + n * V;
    for (int64_t j = 0; j < V; ++j) d[j] = std::exp(row[j] - lse[n]) * s;
    d[targets[n]] -= s;
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}
void round_bf16_inplace(float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

}  // namespace tq::cpu
