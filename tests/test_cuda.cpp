// The CUDA backend against the CPU backend, kernel by kernel (odd shapes, attention longer than
// a key chunk, GQA) and as a whole model (loss, every gradient, SGD steps). Skipped, with the
// reason, where there is no CUDA build or no device.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "core/common.h"
#include "cpu/layers.h"
#include "cuda/ops.h"
#include "model/init.h"
#include "model/qwen3.h"
#include "testing.h"

namespace tq {
namespace {

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_built()) GTEST_SKIP() << "built without the CUDA toolkit: CUDA tests skipped";
    try {
      cuda_device(0);
    } catch (const Error& e) {
      GTEST_SKIP() << e.what() << ": CUDA tests skipped";
    }
  }
};

const Ops& dev() {
  return cuda_ops();
}
// A device copy of a host vector; back() downloads it.
template <typename T>
struct Buf {
  T* p;
  size_t n;
  explicit Buf(const std::vector<T>& h) : n(h.size()) {
    p = static_cast<T*>(dev().alloc(n * sizeof(T)));
    dev().upload(p, h.data(), n * sizeof(T));
  }
  explicit Buf(size_t count, T fill = T(0)) : Buf(std::vector<T>(count, fill)) {}
  ~Buf() { dev().release(p); }
  std::vector<T> back() const {
    dev().sync();
    std::vector<T> h(n);
    dev().download(h.data(), p, n * sizeof(T));
    return h;
  }
};
std::vector<float> randf(size_t n, uint32_t seed, double scale = 1.0) {
  return test::to_f(test::randn(n, seed, scale));
}
constexpr double kTol = 2e-6;  // fp32, another summation order

// Block-causal attention's doc_start for B rows of T made-up tokens with an eos (0) about every
// `every` (mark_documents), and the tokens with it
Batch documents(int64_t B, int64_t T, int64_t V, int every, uint32_t seed) {
  std::mt19937 g(seed);
  Batch b;
  b.B = B, b.T = T;
  for (int64_t i = 0; i <= B * T; ++i)
    b.targets.push_back(g() % uint32_t(every) == 0 ? 0 : int32_t(1 + g() % uint32_t(V - 1)));
  b.tokens.assign(b.targets.begin(), b.targets.end() - 1);
  b.targets.erase(b.targets.begin());
  mark_documents(b, 0);
  return b;
}

TEST_F(Cuda, ElementwiseAndBf16RulesAreTheCpus) {
  const int64_t n = 100003;
  std::vector<float> x = randf(n, 1), y = randf(n, 2);
  x[5] = NAN, x[6] = INFINITY, x[7] = 1.0f + 3.0f / 256;  // NaN kept, a tie to even
  std::vector<uint16_t> h(n), g(n);
  for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(y[i]), g[i] = f32_to_bf16(x[i] * 0.1f);
  g[5] = 0;
  {  // round_bf16_inplace, add_inplace, widen: bit for bit
    Buf<float> dx(x), dy(y);
    dev().round_bf16_inplace(dx.p, n);
    dev().add_inplace(dy.p, dx.p, n);
    std::vector<float> rx = x, ry = y;
    cpu::round_bf16_inplace(rx.data(), n);
    cpu::add_inplace(ry.data(), rx.data(), n);
    const std::vector<float> gx = dx.back(), gy = dy.back();
    EXPECT_EQ(0, std::memcmp(gx.data(), rx.data(), n * 4));
    EXPECT_EQ(0, std::memcmp(gy.data(), ry.data(), n * 4));
  }
  {  // bf16 SGD (optax's roundings) and gradient accumulation: bit for bit
    Buf<uint16_t> w(h), gr(g);
    dev().sgd_update_bf16(w.p, gr.p, n, 0.05f);
    Buf<uint16_t> acc(h);
    Buf<float> add(y);
    dev().bf16_accumulate(acc.p, add.p, n);
    std::vector<uint16_t> rw = h, racc = h;
    cpu_ops().sgd_update_bf16(rw.data(), g.data(), n, 0.05f);
    cpu_ops().bf16_accumulate(racc.data(), y.data(), n);
    EXPECT_EQ(w.back(), rw);
    EXPECT_EQ(acc.back(), racc);
  }
  {  // fp32 SGD
    std::vector<float> w0 = randf(n, 3), g0 = randf(n, 4);
    Buf<float> w(w0), gr(g0);
    dev().sgd_update_f32(w.p, gr.p, n, 0.05f);
    cpu_ops().sgd_update_f32(w0.data(), g0.data(), n, 0.05f);
    EXPECT_EQ(w.back(), w0);
  }
}

// The text trainer's optimizer kernels against the CPU's: the norm's sum of squares (another
// summation order), AdamW and SGD with clipping, and the model's copy (bf16: the rounding of
// the device's own new weights, bit for bit).
TEST_F(Cuda, OptimizerStepIsTheCpus) {
  const int64_t n = 3 * kNormChunk + 101;
  for (const bool adamw : {true, false})
    for (const bool bf16 : {false, true}) {
      std::vector<float> p = randf(n, 5, 0.1), m = randf(n, 6, 1e-3), g = randf(n, 7, 1e-2);
      std::vector<float> v(n);
      for (int64_t i = 0; i < n; ++i) v[i] = 1e-6f * float(i % 13);
      Buf<float> dp(p), dm(m), dv(v), dg(g);
      Buf<float> copy32(static_cast<size_t>(n));
      Buf<uint16_t> copy16(static_cast<size_t>(n));
      const double dn = dev().scale_sum_squares(dg.p, n, 0.5f);
      const double cn = cpu_ops().scale_sum_squares(g.data(), n, 0.5f);
      EXPECT_NEAR(dn, cn, 1e-12 * cn);
      OptimizerStep st{};
      st.adamw = adamw, st.gscale = 0.7f, st.lr = 1e-3f;
      st.decay = 1 - 1e-4f, st.w1 = 0.1f, st.b2 = 0.95f, st.w2 = 0.05f;
      st.step_size = 2e-3f, st.bc2_sqrt = 0.3f, st.eps = 1e-8f;
      void* out = bf16 ? static_cast<void*>(copy16.p) : static_cast<void*>(copy32.p);
      dev().optimizer_step(dp.p, adamw ? dm.p : nullptr, adamw ? dv.p : nullptr, dg.p, n, st, out,
                           bf16);
      std::vector<float> c32(n);
      cpu_ops().optimizer_step(p.data(), m.data(), v.data(), g.data(), n, st, c32.data(), false);
      const std::vector<float> gp = dp.back();
      EXPECT_LT(test::rel_l2(gp, p), kTol);
      if (adamw) {
        EXPECT_LT(test::rel_l2(dm.back(), m), kTol);
        EXPECT_LT(test::rel_l2(dv.back(), v), kTol);
      }
      if (bf16) {
        const std::vector<uint16_t> h = copy16.back();
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h[i], f32_to_bf16(gp[i])) << i;
      } else {
        EXPECT_EQ(copy32.back(), gp);
      }
    }
}

TEST_F(Cuda, EmbeddingAndRmsNorm) {
  const int64_t V = 37, C = 300, N = 513;
  std::vector<int32_t> tok(N);
  for (int64_t i = 0; i < N; ++i) tok[i] = int32_t((i * 7) % V);  // repeats
  std::vector<float> E = randf(V * C, 5), dout = randf(N * C, 6), w = randf(C, 7);
  Buf<int32_t> t(tok);
  Buf<float> dE(E), out(static_cast<size_t>(N * C)), g(dout), dw(w), xn(static_cast<size_t>(N * C)),
      rs(static_cast<size_t>(N)), dx(static_cast<size_t>(N * C)), wt(w);
  dev().embedding_forward(out.p, t.p, dE.p, N, C);
  dev().embedding_backward(dE.p, g.p, t.p, N, C);
  std::vector<float> ro(N * C), rE = E;
  cpu::embedding_forward(ro.data(), tok.data(), E.data(), N, C);
  cpu::embedding_backward(rE.data(), dout.data(), tok.data(), N, C);
  EXPECT_EQ(out.back(), ro);
  EXPECT_LT(test::rel_l2(dE.back(), rE), kTol);
  // RMSNorm on the embedding output, rows of C and of a head dim (many short rows)
  for (int64_t cols : {C, int64_t(12)}) {
    const int64_t rows = N * C / cols;
    dev().rmsnorm_forward(xn.p, rs.p, out.p, wt.p, rows, cols, 1e-6);
    dev().rmsnorm_backward(dx.p, dw.p, g.p, out.p, rs.p, wt.p, rows, cols);
    std::vector<float> rxn(N * C), rrs(rows), rdx(N * C), rdw = w;
    cpu::rmsnorm_forward(rxn.data(), rrs.data(), ro.data(), w.data(), rows, cols, 1e-6);
    cpu::rmsnorm_backward(rdx.data(), rdw.data(), dout.data(), ro.data(), rrs.data(), w.data(),
                          rows, cols);
    EXPECT_LT(test::rel_l2(xn.back(), rxn), kTol) << cols;
    std::vector<float> grs = rs.back();
    grs.resize(static_cast<size_t>(rows));
    EXPECT_LT(test::rel_l2(grs, rrs), kTol) << cols;
    EXPECT_LT(test::rel_l2(dx.back(), rdx), 1e-5) << cols;
    std::vector<float> gdw = dw.back();
    gdw.resize(static_cast<size_t>(cols));
    rdw.resize(static_cast<size_t>(cols));
    EXPECT_LT(test::rel_l2(gdw, rdw), 1e-5) << cols;
    dev().upload(dw.p, w.data(), w.size() * 4);
  }
}

TEST_F(Cuda, MatmulsOverOddShapes) {
  for (auto [N, IC, OC] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                           {5, 17, 3},
                           {32, 256, 4096},
                           {67, 129, 33}}) {
    std::vector<float> x = randf(N * IC, 8), W = randf(OC * IC, 9), g = randf(N * OC, 10),
                       dW0 = randf(OC * IC, 11);
    Buf<float> dx_(x), dW_(W), dg(g), out(static_cast<size_t>(N * OC)),
        dx(static_cast<size_t>(N * IC)), dW(dW0);
    dev().matmul_forward(out.p, dx_.p, dW_.p, N, IC, OC);
    dev().matmul_backward(dx.p, dW.p, dg.p, dx_.p, dW_.p, N, IC, OC);
    std::vector<float> ro(N * OC), rdx(N * IC), rdW = dW0;
    cpu::matmul_forward(ro.data(), x.data(), W.data(), N, IC, OC);
    cpu::matmul_backward(rdx.data(), rdW.data(), g.data(), x.data(), W.data(), N, IC, OC);
    EXPECT_LT(test::rel_l2(out.back(), ro), 1e-5) << N << "x" << IC << "x" << OC;
    EXPECT_LT(test::rel_l2(dx.back(), rdx), 1e-5);
    EXPECT_LT(test::rel_l2(dW.back(), rdW), 1e-5);
  }
}

TEST_F(Cuda, QkvRopeSwigluCrossEntropy) {
  const int64_t B = 2, T = 19, H = 6, KVH = 2, D = 8, N = B * T, R = (H + 2 * KVH) * D, F = 45,
                V = 301;
  std::vector<float> qkv = randf(N * R, 12);
  Buf<float> dqkv(qkv), q(static_cast<size_t>(N * H * D)), k(static_cast<size_t>(N * KVH * D)),
      v(static_cast<size_t>(N * KVH * D)), back(static_cast<size_t>(N * R));
  dev().qkv_split_forward(q.p, k.p, v.p, dqkv.p, N, H, KVH, D);
  dev().qkv_split_backward(back.p, q.p, k.p, v.p, N, H, KVH, D);
  std::vector<float> rq(N * H * D), rk(N * KVH * D), rv(N * KVH * D);
  cpu::qkv_split_forward(rq.data(), rk.data(), rv.data(), qkv.data(), N, H, KVH, D);
  EXPECT_EQ(q.back(), rq);
  EXPECT_EQ(k.back(), rk);
  EXPECT_EQ(v.back(), rv);
  EXPECT_EQ(back.back(), qkv);  // the split is a permutation

  std::vector<float> cs, sn;
  rope_tables(cs, sn, T, D, 1e6);
  Buf<float> dc(cs), ds(sn);
  dev().rope_forward(q.p, q.p, dc.p, ds.p, B, T, H, D, nullptr);  // in place, as the model calls it
  std::vector<float> rr = rq;
  cpu::rope_forward(rr.data(), rr.data(), cs.data(), sn.data(), B, T, H, D);
  EXPECT_LT(test::rel_l2(q.back(), rr), kTol);
  dev().rope_backward(q.p, q.p, dc.p, ds.p, B, T, H, D, nullptr);
  EXPECT_LT(test::rel_l2(q.back(), rq), 1e-6);  // a rotation and its transpose
  // block-causal positions, each document's from 0
  const std::vector<int32_t> docs = documents(B, T, 50, 3, 20).doc_start;
  Buf<int32_t> ddoc(docs);
  dev().rope_forward(q.p, q.p, dc.p, ds.p, B, T, H, D, ddoc.p);
  rr = rq;
  cpu::rope_forward(rr.data(), rr.data(), cs.data(), sn.data(), B, T, H, D, docs.data());
  EXPECT_LT(test::rel_l2(q.back(), rr), kTol);
  dev().rope_backward(q.p, q.p, dc.p, ds.p, B, T, H, D, ddoc.p);
  EXPECT_LT(test::rel_l2(q.back(), rq), 1e-6);

  std::vector<float> ab = randf(N * 2 * F, 13, 3.0), g = randf(N * F, 14);
  Buf<float> dab(ab), m(static_cast<size_t>(N * F)), dg(g), dd(static_cast<size_t>(N * 2 * F));
  dev().swiglu_forward(m.p, dab.p, N, F, false);
  dev().swiglu_backward(dd.p, dg.p, dab.p, N, F, false);
  std::vector<float> rm(N * F), rd(N * 2 * F);
  cpu::swiglu_forward(rm.data(), ab.data(), N, F, false);
  cpu::swiglu_backward(rd.data(), g.data(), ab.data(), N, F, false);
  std::vector<float> fm = m.back(), fd = dd.back();
  EXPECT_LT(test::rel_l2(fm, rm), 1e-6);
  EXPECT_LT(test::rel_l2(fd, rd), 1e-6);
  // rnd: the device's own values, stored rounded to bf16 (the CPU's rule)
  dev().swiglu_forward(m.p, dab.p, N, F, true);
  dev().swiglu_backward(dd.p, dg.p, dab.p, N, F, true);
  cpu::round_bf16_inplace(fm.data(), N * F);
  cpu::round_bf16_inplace(fd.data(), N * 2 * F);
  EXPECT_EQ(m.back(), fm);
  EXPECT_EQ(dd.back(), fd);

  std::vector<float> logits = randf(N * V, 15, 4.0);
  std::vector<int32_t> tgt(N);
  for (int64_t i = 0; i < N; ++i) tgt[i] = int32_t((i * 13) % V);
  Buf<float> dl(logits), lse(static_cast<size_t>(N));
  Buf<int32_t> dt(tgt);
  const double loss = dev().crossentropy_forward(lse.p, dl.p, dt.p, N, V);
  dev().crossentropy_backward(dl.p, dl.p, lse.p, dt.p, N, V, 1.0 / N);
  std::vector<float> rl(N), rdl = logits;
  const double rloss = cpu::crossentropy_forward(rl.data(), logits.data(), tgt.data(), N, V);
  cpu::crossentropy_backward(rdl.data(), rdl.data(), rl.data(), tgt.data(), N, V, 1.0 / N);
  EXPECT_NEAR(loss, rloss, 1e-6 * rloss);
  EXPECT_LT(test::rel_l2(lse.back(), rl), kTol);
  EXPECT_LT(test::rel_l2(dl.back(), rdl), 1e-5);
}

struct AttnShape {
  int64_t B, T, H, KVH, D;
  int every = 0;  // 0: causal; else block-causal, an eos about every `every` tokens (documents)
};
class CudaAttention : public Cuda, public ::testing::WithParamInterface<AttnShape> {};
TEST_P(CudaAttention, MatchesTheCpu) {
  const auto [B, T, H, KVH, D, every] = GetParam();
  const int64_t nq = B * T * H * D, nk = B * T * KVH * D;
  std::vector<float> q = randf(nq, 16), k = randf(nk, 17), v = randf(nk, 18), g = randf(nq, 19);
  const std::vector<int32_t> docs =
      every ? documents(B, T, 50, every, 21).doc_start : std::vector<int32_t>(1);
  const int32_t* doc = every ? docs.data() : nullptr;
  Buf<float> dq_(q), dk_(k), dv_(v), dg(g), out(static_cast<size_t>(nq)),
      lse(static_cast<size_t>(B * H * T)), dq(static_cast<size_t>(nq), 3.0f),
      dk(static_cast<size_t>(nk), 3.0f), dv(static_cast<size_t>(nk), 3.0f);
  Buf<int32_t> dd(docs);
  dev().attention_forward(out.p, lse.p, dq_.p, dk_.p, dv_.p, B, T, H, KVH, D, doc ? dd.p : nullptr);
  dev().attention_backward(dq.p, dk.p, dv.p, dg.p, out.p, lse.p, dq_.p, dk_.p, dv_.p, B, T, H, KVH,
                           D, doc ? dd.p : nullptr);
  std::vector<float> ro(nq), rl(cpu::attention_stats(B, T, H, KVH, D, false)), rdq(nq), rdk(nk),
      rdv(nk);
  cpu::attention_forward(ro.data(), rl.data(), q.data(), k.data(), v.data(), B, T, H, KVH, D, doc);
  cpu::attention_backward(rdq.data(), rdk.data(), rdv.data(), g.data(), ro.data(), rl.data(),
                          q.data(), k.data(), v.data(), B, T, H, KVH, D, doc);
  EXPECT_LT(test::rel_l2(out.back(), ro), 1e-5);
  EXPECT_LT(test::rel_l2(lse.back(), std::vector<float>(rl.begin(), rl.begin() + B * H * T)), 1e-6);
  EXPECT_LT(test::rel_l2(dq.back(), rdq), 1e-5);
  EXPECT_LT(test::rel_l2(dk.back(), rdk), 1e-5);
  EXPECT_LT(test::rel_l2(dv.back(), rdv), 1e-5);
}
INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttention,
    ::testing::Values(AttnShape{1, 1, 1, 1, 2}, AttnShape{2, 9, 4, 2, 8},
                      AttnShape{1, 130, 4, 4, 16}, AttnShape{2, 300, 4, 2, 128},
                      AttnShape{1, 70, 8, 1, 200}, AttnShape{3, 300, 4, 2, 128, 40},
                      AttnShape{4, 130, 4, 4, 16, 3}),
    [](const ::testing::TestParamInfo<AttnShape>& i) {
      const AttnShape& a = i.param;  // (snprintf: GCC 12's -Wrestrict
      char b[96];                    // misfires on string + chains)
      std::snprintf(b, sizeof b, "B%lld_T%lld_H%lld_KVH%lld_D%lld%s", (long long)a.B,
                    (long long)a.T, (long long)a.H, (long long)a.KVH, (long long)a.D,
                    a.every ? "_documents" : "");
      return std::string(b);
    });

// The whole step on the GPU against the CPU: first-step loss and every gradient, then SGD.
TEST_F(Cuda, ModelMatchesTheCpuBackend) {
  //        name    V    C   L  H  KVH D   F   ctx  theta tied eps
  for (bool tied : {true, false}) {
    const Config c = {"tiny", 211, 64, 2, 4, 2, 32, 96, 256, 1e6, tied, 1e-6f};
    const ParamLayout p = make_layout(c);
    std::vector<float> w(p.total);
    init_params(w.data(), c, p, 5);
    for (DType dt : {DType::f32, DType::bf16}) {
      const Batch b = fixed_batch(2, 150, c.V);
      Qwen3 g(c, dt, 2, 150, cuda_ops()), h(c, dt, 2, 150, cpu_ops());
      g.set_params(w.data());
      h.set_params(w.data());
      const double lg = g.forward(b), lh = h.forward(b);
      g.backward(), h.backward();
      std::vector<float> gg(p.total), gh(p.total);
      g.get_grads(gg.data());
      h.get_grads(gh.data());
      const bool f32 = dt == DType::f32;
      EXPECT_NEAR(lg, lh, f32 ? 1e-5 : 2e-3) << "tied=" << tied << " f32=" << f32;
      for (const ParamView& v : p.params) {
        const std::vector<float> a(gg.begin() + v.offset, gg.begin() + v.offset + v.numel),
            r(gh.begin() + v.offset, gh.begin() + v.offset + v.numel);
        EXPECT_LT(test::rel_l2(a, r), f32 ? 1e-4 : 3e-2) << v.name << " f32=" << f32;
      }
      for (int s = 0; s < 5; ++s) {
        g.sgd_update(0.05f), h.sgd_update(0.05f);
        const double a = g.forward(b), r = h.forward(b);
        g.backward(), h.backward();
        EXPECT_NEAR(a, r, f32 ? 1e-4 : 2e-2) << "step " << s + 2 << " f32=" << f32;
      }
    }
  }
}

// Block-causal attention (Batch::doc_start) through the whole step: loss and every gradient.
TEST_F(Cuda, BlockCausalModelMatchesTheCpuBackend) {
  //                 name    V    C   L  H  KVH D   F   ctx  theta tied eps
  const Config c = {"tiny", 211, 64, 2, 4, 2, 32, 96, 256, 1e6, true, 1e-6f};
  const ParamLayout p = make_layout(c);
  std::vector<float> w(p.total);
  init_params(w.data(), c, p, 5);
  const Batch b = documents(2, 150, c.V, 12, 22);
  Qwen3 g(c, DType::f32, 2, 150, cuda_ops()), h(c, DType::f32, 2, 150, cpu_ops());
  g.set_params(w.data());
  h.set_params(w.data());
  EXPECT_NEAR(g.forward(b), h.forward(b), 1e-5);
  g.backward(), h.backward();
  std::vector<float> gg(p.total), gh(p.total);
  g.get_grads(gg.data());
  h.get_grads(gh.data());
  for (const ParamView& v : p.params) {
    const std::vector<float> a(gg.begin() + v.offset, gg.begin() + v.offset + v.numel),
        r(gh.begin() + v.offset, gh.begin() + v.offset + v.numel);
    EXPECT_LT(test::rel_l2(a, r), 1e-4) << v.name;
  }
}

// Generation on the GPU against the CPU: prefill and decode over the KV cache give the CPU's
// logits (three sequences of different lengths decoded together, the cache past a key chunk).
TEST_F(Cuda, GenerationMatchesTheCpuBackend) {
  //                 name    V    C   L  H  KVH D   F   ctx  theta tied eps
  const Config c = {"tiny", 211, 64, 2, 4, 2, 32, 96, 256, 1e6, true, 1e-6f};
  const ParamLayout p = make_layout(c);
  std::vector<float> w(p.total);
  init_params(w.data(), c, p, 5);
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t B = 3, steps = 20, T = 140 + steps;
    Qwen3 g(c, dt, B, T, cuda_ops(), Use::generate), h(c, dt, B, T, cpu_ops(), Use::generate);
    g.set_params(w.data());
    h.set_params(w.data());
    const bool f32 = dt == DType::f32;
    std::vector<float> lg(size_t(B * c.V)), lh(lg.size());
    for (int64_t b = 0; b < B; ++b) {
      std::vector<int32_t> prompt;
      for (int64_t t = 0; t < 140 - 60 * b; ++t) prompt.push_back(int32_t((t * 7 + b) % c.V));
      g.prefill(b, prompt.data(), int64_t(prompt.size()), lg.data());
      h.prefill(b, prompt.data(), int64_t(prompt.size()), lh.data());
      EXPECT_LT(test::rel_l2(std::vector<float>(lg.begin(), lg.begin() + c.V),
                             std::vector<float>(lh.begin(), lh.begin() + c.V)),
                f32 ? 1e-4 : 3e-2)
          << "prefill " << b << " f32=" << f32;
    }
    for (int64_t s = 0; s < steps; ++s) {
      std::vector<int32_t> next;
      for (int64_t b = 0; b < B; ++b) next.push_back(int32_t((s * 13 + b * 5) % c.V));
      g.decode(next.data(), B, lg.data());
      h.decode(next.data(), B, lh.data());
      EXPECT_LT(test::rel_l2(lg, lh), f32 ? 1e-4 : 3e-2) << "step " << s << " f32=" << f32;
    }
  }
}

}  // namespace
}  // namespace tq
