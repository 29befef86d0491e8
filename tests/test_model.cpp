// Whole-model tests of the training step on small configs.
#include <gtest/gtest.h>

#include "cpu/gemm.h"
#include "cpu/layers.h"
#include "model/init.h"
#include "model/profile.h"
#include "model/qwen3.h"
#include "ref/model.h"
#include "testing.h"

namespace tq {
namespace {

Config tiny(bool tied = true) {
  //        name    V   C   L  H  KVH D   F   ctx  theta tied eps
  return {"tiny", 97, 32, 2, 4, 2, 16, 48, 64, 1e4, tied, 1e-6f};
}

TEST(Presets, ParameterCountsMatchTheSpec) {
  const std::vector<std::pair<std::string, size_t>> expect = {
      {"debugmodel", 31987968}, {"0.6B", 596049920},  {"1.7B", 1720574976}, {"4B", 4022468096},
      {"8B", 8190735360},       {"14B", 14768307200}, {"32B", 32762123264}};
  for (const auto& [name, n] : expect) EXPECT_EQ(make_layout(preset(name)).total, n) << name;
  const ParamLayout p = make_layout(preset("debugmodel"));
  EXPECT_EQ(p.params.size(), 74u);  // 9 per layer + final norm + tied embedding
  EXPECT_EQ(p.lm_head, p.tok_emb);
  EXPECT_EQ(p.layers[0].w3, p.layers[0].w1 + 3072 * 256);   // fused [2F, C] for one matmul
  EXPECT_EQ(p.layers[0].k_norm, p.layers[0].q_norm + 128);  // one [2, D] view for QK-norm
  EXPECT_THROW(preset("7B"), Error);
}

// A batch of made-up text for block-causal attention: ids 1..V-1 with the eos 0 about one
// token in four, its documents marked (mark_documents).
Batch text_batch(int64_t B, int64_t T, int64_t V, uint32_t seed = 1) {
  std::mt19937 g(seed);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i <= B * T; ++i) ids.push_back(g() % 4 == 0 ? 0 : int32_t(1 + g() % (V - 1)));
  Batch b;
  b.B = B, b.T = T;
  b.tokens.assign(ids.begin(), ids.end() - 1);
  b.targets.assign(ids.begin() + 1, ids.end());
  mark_documents(b, 0);
  return b;
}

std::vector<float> tiny_params(const Config& c) {
  const ParamLayout p = make_layout(c);
  std::vector<float> w(p.total);
  init_params(w.data(), c, p, 3);
  // perturb the norm weights away from 1 so their gradients are exercised
  for (const ParamView& v : p.params)
    if (v.shape.size() == 1)
      for (size_t i = 0; i < v.numel; ++i)
        w[v.offset + i] = 1.0f + 0.1f * std::sin(float(i + v.offset));
  return w;
}

TEST(Qwen3, ForwardMatchesTheReferenceModel) {
  for (bool tied : {true, false}) {
    const Config c = tiny(tied);
    const std::vector<float> w = tiny_params(c);
    Batch b = fixed_batch(2, 13, c.V);
    for (size_t i = 0; i < b.tokens.size(); ++i) b.tokens[i] = int32_t((i * 31 + 5) % c.V);
    Qwen3 m(c, DType::f32, 2, 13, cpu_ops());
    m.set_params(w.data());
    const double loss = m.forward(b);
    int64_t hits_ref = 0;
    const double ref_loss = ref::model_loss(c, w.data(), b, &hits_ref);
    EXPECT_NEAR(loss, ref_loss, 1e-5) << "tied=" << tied;
    EXPECT_EQ(m.correct(b), hits_ref);
  }
}

// A batch of another size than the model was built for is an error, not a read past the end.
TEST(Qwen3, RefusesABatchOfAnotherSize) {
  const Config c = tiny();
  Qwen3 m(c, DType::f32, 2, 13, cpu_ops());
  EXPECT_THROW(m.forward(fixed_batch(1, 13, c.V)), Error);
  Batch b = fixed_batch(2, 13, c.V);
  b.targets.pop_back();
  EXPECT_THROW(m.forward(b), Error);
  EXPECT_NO_THROW(m.forward(fixed_batch(2, 13, c.V)));
  // document starts: [B*T], from 0 in each row, never past the token nor decreasing
  for (const auto& [at, d] :
       std::vector<std::pair<int, int32_t>>{{-1, 0}, {0, 1}, {5, 6}, {14, -1}}) {
    b = text_batch(2, 13, c.V);
    if (at < 0)
      b.doc_start.pop_back();
    else
      b.doc_start[size_t(at)] = d;
    EXPECT_THROW(m.forward(b), Error) << at;
  }
  b = text_batch(2, 13, c.V);
  b.doc_start[7] = b.doc_start[8] = 7, b.doc_start[9] = 6;  // decreasing
  EXPECT_THROW(m.forward(b), Error);
  EXPECT_NO_THROW(m.forward(text_batch(2, 13, c.V)));
}

// The analytic gradient against a directional finite difference of the reference model, causal
// and block-causal.
TEST(Qwen3, GradientMatchesFiniteDifferences) {
  for (bool tied : {true, false})
    for (bool documents : {false, true}) {
      const Config c = tiny(tied);
      const std::vector<float> w = tiny_params(c);
      const Batch b = documents ? text_batch(2, 9, c.V, 4) : fixed_batch(2, 9, c.V);
      Qwen3 m(c, DType::f32, 2, 9, cpu_ops());
      m.set_params(w.data());
      m.forward(b);
      m.backward();
      std::vector<float> g(w.size());
      m.get_grads(g.data());
      // per parameter tensor: d/dh L(w + h u) with u = the tensor's gradient direction
      for (const ParamView& v : make_layout(c).params) {
        double gg = 0;
        for (size_t i = 0; i < v.numel; ++i) gg += double(g[v.offset + i]) * g[v.offset + i];
        const double norm = std::sqrt(gg);
        ASSERT_GT(norm, 0) << v.name;
        const double h = 1e-3;
        std::vector<float> wp = w, wm = w;
        for (size_t i = 0; i < v.numel; ++i) {
          const double u = g[v.offset + i] / norm;
          wp[v.offset + i] += float(h * u);
          wm[v.offset + i] -= float(h * u);
        }
        const double num =
            (ref::model_loss(c, wp.data(), b) - ref::model_loss(c, wm.data(), b)) / (2 * h);
        EXPECT_NEAR(num, norm, 1e-3 * norm + 1e-4)
            << v.name << " tied=" << tied << " documents=" << documents;
      }
    }
}

TEST(Qwen3, RepeatedBatchGivesTheSameLossAndGradients) {
  const Config c = tiny();
  const std::vector<float> w = tiny_params(c);
  std::vector<float> g1(w.size()), g3(w.size());
  Qwen3 m1(c, DType::f32, 1, 11, cpu_ops()), m3(c, DType::f32, 3, 11, cpu_ops());
  m1.set_params(w.data());
  m3.set_params(w.data());
  EXPECT_NEAR(m1.forward(fixed_batch(1, 11, c.V)), m3.forward(fixed_batch(3, 11, c.V)), 1e-6);
  m1.backward();
  m3.backward();
  m1.get_grads(g1.data());
  m3.get_grads(g3.data());
  EXPECT_LT(test::rel_l2(g3, g1), 1e-5);
}

TEST(Qwen3, SgdStepLowersTheLossAndIsDeterministic) {
  const Config c = tiny();
  const std::vector<float> w = tiny_params(c);
  const Batch b = fixed_batch(1, 16, c.V);
  std::vector<double> runs[2];
  for (auto& losses : runs) {
    Qwen3 m(c, DType::f32, 1, 16, cpu_ops());
    m.set_params(w.data());
    for (int s = 0; s < 5; ++s) {
      losses.push_back(m.forward(b));
      m.backward();
      m.sgd_update(0.5f);
    }
  }
  EXPECT_EQ(runs[0], runs[1]);  // bit-for-bit for a fixed thread count
  EXPECT_LT(runs[0].back(), runs[0].front());
}

// A training run may change its thread count between steps (cpu/runtime.h), so a step must
// not depend on it. On our kernels it does not: every parameter, kept gradient and loss bit for
// bit at 1, 2 and 3 threads, both dtypes, at a size where every kernel splits its work (the
// norms' weight gradients by chunks of rows). Two sums do follow the thread count, and stay
// within round-off of a one-thread run: OpenBLAS's (the portable path) and oneDNN's fp32 dx.
TEST(Qwen3, AStepIsTheSameAtEveryThreadCount) {
  //              name  V   C    L  H  KVH D   F    ctx  theta tied eps
  const Config c{"mid", 97, 128, 1, 4, 2, 32, 160, 256, 1e4, true, 1e-6f};
  const std::vector<float> w = tiny_params(c);
  const int64_t B = 2, T = 256;
  const Batch b = fixed_batch(B, T, c.V);
  const int before = cpu::threads();
  struct Run {
    std::vector<double> losses;
    std::vector<float> p, g;
  };
  const auto run = [&](DType dt, int t) {
    cpu::set_threads(t);
    Qwen3 fused(c, dt, B, T, cpu_ops(), Use::sgd), plain(c, dt, B, T, cpu_ops());
    fused.set_params(w.data());
    plain.set_params(w.data());
    Run r;
    for (int s = 0; s < 2; ++s) {
      r.losses.push_back(fused.forward(b));
      fused.backward_sgd(0.1f);
    }
    plain.forward(b);
    plain.backward();
    r.p.resize(w.size());
    r.g.resize(w.size());
    fused.get_params(r.p.data());
    plain.get_grads(r.g.data());
    return r;
  };
  for (bool library : {false, true}) {
    if (library && !cpu::library_dx()) continue;  // oneDNN not in use here
    const cpu::Sgemm was = library ? nullptr : cpu::swap_library_sgemm(nullptr);
    const bool exact = cpu::own_kernels() && !library;
    for (DType dt : {DType::f32, DType::bf16}) {
      const Run one = run(dt, 1);
      // Measured on the portable path: fp32 within 2.5e-7, bf16 within 6e-4 (a sum that moves
      // by an fp32 ulp can move a stored bf16 value by a bf16 one, 2^-8): bounds ~5-10x those
      const double tol = dt == DType::f32 ? 1e-6 : 5e-3;
      for (int t : {2, 3}) {
        const Run r = run(dt, t);
        const std::string what = std::to_string(t) + " threads, " + dtype_name(dt) +
                                 (library ? ", oneDNN dx" : "") +
                                 (exact ? "" : " (within round-off)");
        if (exact) {
          EXPECT_EQ(r.losses, one.losses) << what;
          EXPECT_TRUE(r.p == one.p) << "parameters at " << what;
          EXPECT_TRUE(r.g == one.g) << "gradients at " << what;
        } else {
          for (size_t s = 0; s < r.losses.size(); ++s)
            EXPECT_NEAR(r.losses[s], one.losses[s], tol) << what;
          EXPECT_LT(test::rel_l2(r.p, one.p), tol) << "parameters at " << what;
          EXPECT_LT(test::rel_l2(r.g, one.g), tol) << "gradients at " << what;
        }
      }
    }
    if (!library) cpu::swap_library_sgemm(was);
  }
  cpu::set_threads(before);
}

// `train --profile`'s work columns: a step's counted arithmetic is the model's (6 flops a
// matrix entry a token; attention 12 D a query-key pair the mask lets through, a head and a
// layer), and every kernel that ran counts its traffic.
TEST(Profile, CountsAStepsArithmeticAndEveryKernelsTraffic) {
  for (DType dt : {DType::f32, DType::bf16})
    for (bool tied : {true, false}) {
      const Config c = tiny(tied);
      const int64_t B = 2, T = 13, N = B * T;
      Qwen3 m(c, dt, B, T, profiled(cpu_ops()));
      m.set_params(tiny_params(c).data());
      reset_kernel_times();
      m.forward(fixed_batch(B, T, c.V));
      m.backward_sgd(0.1f);
      double products = 0, attention = 0;
      for (const KernelTime& k : kernel_times()) {
        EXPECT_GT(k.bytes, 0) << k.name;
        (k.name.rfind("attention", 0) == 0 ? attention : products) += k.flops;
      }
      const double layer = double(c.qkv_rows() * c.C + c.H * c.D * c.C + 3 * c.C * c.F);
      EXPECT_DOUBLE_EQ(products, 6.0 * double(N) * (double(c.L) * layer + double(c.C * c.V)));
      EXPECT_DOUBLE_EQ(attention, 12.0 * double(c.L * B * c.H * c.D) * double(T * (T + 1) / 2));
    }
}

// backward_sgd (the step fused into the weight-gradient products where the backend can) is
// backward + sgd_update: bit for bit while one k block sums all tokens, to rounding beyond.
TEST(Qwen3, FusedSgdStepEqualsBackwardThenSgd) {
  for (DType dt : {DType::f32, DType::bf16})
    for (bool tied : {true, false})
      for (int64_t T : {16, 300}) {
        const Config c = tiny(tied);
        const std::vector<float> w = tiny_params(c);
        const Batch b = fixed_batch(1, T, c.V);
        Qwen3 m1(c, dt, 1, T, cpu_ops()), m2(c, dt, 1, T, cpu_ops());
        m1.set_params(w.data());
        m2.set_params(w.data());
        std::vector<float> p1(w.size()), p2(w.size());
        for (int s = 0; s < 3; ++s) {
          const double l1 = m1.forward(b), l2 = m2.forward(b);
          m1.backward();
          m1.sgd_update(0.3f);  // not a power of two: the bf16 step's roundings all matter
          m2.backward_sgd(0.3f);
          m1.get_params(p1.data());
          m2.get_params(p2.data());
          const std::string what = std::string(dtype_name(dt)) + (tied ? " tied" : " untied") +
                                   " T=" + std::to_string(T) + " step " + std::to_string(s);
          if (T <= 256) {
            ASSERT_EQ(l1, l2) << what;
            ASSERT_EQ(p1, p2) << what;
          } else {
            ASSERT_NEAR(l1, l2, 1e-5 * l1) << what;
            ASSERT_LT(test::rel_l2(p2, p1), dt == DType::f32 ? 1e-6 : 1e-2) << what;
          }
        }
      }
}

// bf16 runs keep the projection qkv and the feed-forward activations in bf16 storage where the
// backend can (the CPU kernels); without those kernels (CUDA) they stay fp32 storage of bf16
// values: the same step, bit for bit, fused step or not (odd F and N: bf16 arrays of odd
// length, odd row strides).
TEST(Qwen3, Bf16ActivationStorageGivesTheSameStep) {
  if (!bf16_acts(cpu_ops(), DType::bf16)) GTEST_SKIP() << "no bf16 kernels (OpenBLAS path)";
  Ops f32ffn = cpu_ops();
  f32ffn.swiglu_forward_bf16 = nullptr;
  f32ffn.swiglu_backward_bf16 = nullptr;
  ASSERT_FALSE(bf16_acts(f32ffn, DType::bf16));
  Config odd = tiny(false);
  odd.F = 45;
  for (const auto& [c, B, T] : {std::tuple{tiny(false), 2, 11}, std::tuple{odd, 1, 7}})
    for (bool fused : {false, true}) {
      const std::vector<float> w = tiny_params(c);
      // (the unfused steps block-causal)
      const Batch b = fused ? fixed_batch(B, T, c.V) : text_batch(B, T, c.V);
      Qwen3 m1(c, DType::bf16, B, T, cpu_ops()), m2(c, DType::bf16, B, T, f32ffn);
      m1.set_params(w.data());
      m2.set_params(w.data());
      std::vector<float> p1(w.size()), p2(w.size());
      for (int s = 0; s < 3; ++s) {
        const std::string what =
            "F=" + std::to_string(c.F) + (fused ? " fused" : "") + " step " + std::to_string(s);
        ASSERT_EQ(m1.forward(b), m2.forward(b)) << what;
        if (fused) {
          m1.backward_sgd(0.3f);
          m2.backward_sgd(0.3f);
        } else {
          m1.backward();
          m2.backward();
          m1.get_grads(p1.data());
          m2.get_grads(p2.data());
          ASSERT_EQ(p1, p2) << what << " gradients";
          m1.sgd_update(0.3f);
          m2.sgd_update(0.3f);
        }
        m1.get_params(p1.data());
        m2.get_params(p2.data());
        ASSERT_EQ(p1, p2) << what;
      }
    }
}

// A backend without the fused residual add + RMSNorm ops (CUDA) gets the model's composition of
// copy, add and norm passes: the same loss, gradients and steps, bit for bit, fused step or not.
TEST(Qwen3, ComposedResidualNormEqualsTheFusedOps) {
  Ops composed = cpu_ops();
  composed.add_rmsnorm_forward = nullptr;
  composed.rmsnorm_backward_add = nullptr;
  for (DType dt : {DType::f32, DType::bf16})
    for (bool tied : {true, false}) {
      const Config c = tiny(tied);
      const std::vector<float> w = tiny_params(c);
      const Batch b = fixed_batch(2, 11, c.V);
      Qwen3 m1(c, dt, 2, 11, cpu_ops()), m2(c, dt, 2, 11, composed);
      for (Qwen3* m : {&m1, &m2}) m->set_params(w.data());
      std::vector<float> g1(w.size()), g2(w.size()), p1(w.size()), p2(w.size());
      const std::string what = std::string(dtype_name(dt)) + (tied ? " tied" : " untied");
      for (int s = 0; s < 2; ++s) {
        ASSERT_EQ(m1.forward(b), m2.forward(b)) << what << " step " << s;
        m1.backward();
        m2.backward();
        m1.get_grads(g1.data());
        m2.get_grads(g2.data());
        ASSERT_EQ(g1, g2) << what << " step " << s;
        m1.sgd_update(0.3f);
        m2.sgd_update(0.3f);
      }
      for (Qwen3* m : {&m1, &m2}) m->forward(b), m->backward_sgd(0.3f);
      m1.get_params(p1.data());
      m2.get_params(p2.data());
      EXPECT_EQ(p1, p2) << what << ": the fused step";
    }
}

// A backend without the fused QK-norm + RoPE op (CUDA) gets the model's composition of the
// split, norms and rotations, from the same saved activations: the same step, bit for bit,
// causal and block-causal.
TEST(Qwen3, ComposedQkNormRopeEqualsTheFusedOp) {
  Ops fused = cpu_ops();
  fused.attention_qkn_forward = nullptr;  // (else attention takes both in)
  fused.attention_qkn_backward = nullptr;
  Ops composed = fused;
  composed.qk_norm_rope_forward = nullptr;
  composed.qk_norm_rope_backward = nullptr;
  for (const bool docs : {false, true})
    for (DType dt : {DType::f32, DType::bf16}) {
      const Config c = tiny(false);
      const std::vector<float> w = tiny_params(c);
      const Batch b = docs ? text_batch(2, 11, c.V) : fixed_batch(2, 11, c.V);
      Qwen3 m1(c, dt, 2, 11, fused), m2(c, dt, 2, 11, composed);
      m1.set_params(w.data());
      m2.set_params(w.data());
      std::vector<float> g1(w.size()), g2(w.size()), p1(w.size()), p2(w.size());
      for (int s = 0; s < 2; ++s) {
        const std::string what = std::string(dtype_name(dt)) + (docs ? " block-causal" : "") +
                                 " step " + std::to_string(s);
        ASSERT_EQ(m1.forward(b), m2.forward(b)) << what;
        m1.backward();
        m2.backward();
        m1.get_grads(g1.data());
        m2.get_grads(g2.data());
        ASSERT_EQ(g1, g2) << what;
        m1.sgd_update(0.3f);
        m2.sgd_update(0.3f);
      }
      m1.get_params(p1.data());
      m2.get_params(p2.data());
      EXPECT_EQ(p1, p2) << dtype_name(dt);
    }
}

// Attention taking QK-norm + RoPE in (attention_qkn_*, our kernels) against the two ops: the
// same loss and gradients, bit for bit, but for q_norm's and k_norm's, summed in another order;
// causal and block-causal.
TEST(Qwen3, AttentionWithQkNormEqualsTheSeparateOps) {
  if (!cpu_ops().attention_qkn_forward) GTEST_SKIP() << "no kernel set here: no fused op";
  Ops separate = cpu_ops();
  separate.attention_qkn_forward = nullptr;
  separate.attention_qkn_backward = nullptr;
  for (const bool docs : {false, true})
    for (DType dt : {DType::f32, DType::bf16}) {
      const Config c = tiny(false);
      const ParamLayout lay = make_layout(c);
      const std::vector<float> w = tiny_params(c);
      const Batch b = docs ? text_batch(2, 11, c.V) : fixed_batch(2, 11, c.V);
      Qwen3 m1(c, dt, 2, 11, cpu_ops()), m2(c, dt, 2, 11, separate);
      m1.set_params(w.data());
      m2.set_params(w.data());
      ASSERT_EQ(m1.forward(b), m2.forward(b)) << dtype_name(dt);
      m1.backward();
      m2.backward();
      std::vector<float> g1(w.size()), g2(w.size());
      m1.get_grads(g1.data());
      m2.get_grads(g2.data());
      for (const auto& l : lay.layers) {  // q_norm and k_norm, adjacent
        const auto at = g1.begin() + std::ptrdiff_t(l.q_norm),
                   at2 = g2.begin() + std::ptrdiff_t(l.q_norm);
        EXPECT_LT(test::rel_l2(std::vector<float>(at, at + 2 * c.D),
                               std::vector<float>(at2, at2 + 2 * c.D)),
                  dt == DType::f32 ? 1e-6 : 1e-2)
            << dtype_name(dt);
        std::copy(at, at + 2 * c.D, at2);
      }
      EXPECT_EQ(g1, g2) << dtype_name(dt) << ": the other gradients";
    }
}

// bf16 gradients straight into bf16 (matrices stored by matmul_backward_bf16g, the embedding
// added by its rows by embedding_backward_bf16) against the fp32 buffer and bf16_accumulate:
// the same loss, gradients and fused step, bit for bit, tied and not.
TEST(Qwen3, Bf16GradientsWithoutTheFp32BufferAreTheSame) {
  if (!cpu_ops().matmul_backward_bf16g) GTEST_SKIP() << "no kernel set here: no bf16 products";
  Ops via_f32 = cpu_ops();
  via_f32.embedding_backward_bf16 = nullptr;
  via_f32.matmul_backward_bf16g = nullptr;
  for (bool tied : {true, false}) {
    const Config c = tiny(tied);
    const std::vector<float> w = tiny_params(c);
    const Batch b = fixed_batch(2, 11, c.V);
    Qwen3 m1(c, DType::bf16, 2, 11, cpu_ops()), m2(c, DType::bf16, 2, 11, via_f32);
    for (Qwen3* m : {&m1, &m2}) m->set_params(w.data());
    ASSERT_EQ(m1.forward(b), m2.forward(b));
    m1.backward();
    m2.backward();
    std::vector<float> g1(w.size()), g2(w.size()), p1(w.size()), p2(w.size());
    m1.get_grads(g1.data());
    m2.get_grads(g2.data());
    EXPECT_EQ(g1, g2) << "tied " << tied;
    for (Qwen3* m : {&m1, &m2}) m->set_params(w.data()), m->forward(b), m->backward_sgd(0.5f);
    m1.get_params(p1.data());
    m2.get_params(p2.data());
    EXPECT_EQ(p1, p2) << "tied " << tied << ": the fused step";
  }
}

TEST(Qwen3, Bf16KeepsParametersAndGradientsInBf16) {
  const Config c = tiny();
  const std::vector<float> w = tiny_params(c);
  const Batch b = fixed_batch(1, 8, c.V);
  Qwen3 m(c, DType::bf16, 1, 8, cpu_ops());
  m.set_params(w.data());
  std::vector<float> p(w.size()), g(w.size());
  const double l0 = m.forward(b);
  m.backward();
  m.get_grads(g.data());
  m.sgd_update(0.5f);
  m.get_params(p.data());
  for (size_t i = 0; i < p.size(); ++i) {
    ASSERT_EQ(p[i], round_bf16(p[i])) << i;
    ASSERT_EQ(g[i], round_bf16(g[i])) << i;
  }
  // close to the fp32 model on the same (rounded) weights
  std::vector<float> wr = w;
  cpu::round_bf16_inplace(wr.data(), int64_t(wr.size()));
  EXPECT_NEAR(l0, ref::model_loss(c, wr.data(), b), 2e-2);
}

// A backend table for plans with all the optional kernels, beside test::bare_ops with none
// (memory_plan reads only which entries are set, so these hold on any CPU).
Ops full_ops() {
  Ops o = cpu_ops();
  o.embedding_forward_bf16 = cpu::embedding_forward_bf16;
  o.embedding_backward_bf16 = cpu::embedding_backward_bf16;
  o.matmul_forward_bf16w = cpu::matmul_forward_bf16w;
  o.matmul_backward_bf16w = cpu::matmul_backward_bf16w;
  o.matmul_backward_bf16g = cpu::matmul_backward_bf16g;
  o.matmul_backward_sgd = cpu::matmul_backward_sgd;
  o.matmul_backward_sgd_bf16w = cpu::matmul_backward_sgd_bf16w;
  o.qk_norm_rope_forward = cpu::qk_norm_rope_forward;
  o.qk_norm_rope_backward = cpu::qk_norm_rope_backward;
  o.attention_forward_bf16 = cpu::attention_forward_bf16;
  o.attention_backward_bf16 = cpu::attention_backward_bf16;
  o.attention_qkn_forward = cpu::attention_qkn_forward;
  o.attention_qkn_backward = cpu::attention_qkn_backward;
  o.swiglu_forward_bf16 = cpu::swiglu_forward_bf16;
  o.swiglu_backward_bf16 = cpu::swiglu_backward_bf16;
  return o;
}

TEST(MemoryPlan, CountsEveryArena) {
  const Config& dm = preset("debugmodel");
  const Ops bare = test::bare_ops(), full = full_ops();
  const MemoryPlan mp = memory_plan(dm, DType::f32, 1, 32, bare, Use::train);
  EXPECT_EQ(mp.params, 31987968u * 4);
  EXPECT_EQ(mp.grads, mp.params);
  EXPECT_GT(mp.activations, 32u * 2048 * 4);  // at least the logits
  EXPECT_LT(mp.activations, 64u << 20);
  // trained by the step alone, but with no fused step: still every gradient
  EXPECT_EQ(memory_plan(dm, DType::f32, 1, 32, bare, Use::sgd).grads, mp.grads);
  // bf16: half the parameter and gradient bytes, plus two fp32 buffers of the largest
  // parameter (w1|w3, 2 x 3072 x 256) for the layers' fp32 views
  const MemoryPlan mb = memory_plan(dm, DType::bf16, 1, 32, bare, Use::train);
  EXPECT_EQ(mb.params, 31987968u * 2);
  EXPECT_EQ(mb.grads, mb.params);
  EXPECT_EQ(mb.activations, mp.activations);
  EXPECT_EQ(mb.scratch, mp.scratch + 2u * (2 * 3072 * 256) * 4);
  // with activations in bf16 storage: qkv [N, 4096], q and att [N, 2048], k and v [N, 1024],
  // ab [N, 2F] and m [N, F] of each of the 8 layers, and the scratch of their gradients, take
  // half the bytes; the products take the bf16 weights and the embedding is gathered from
  // bf16, so the weight view holds only a norm (C = 256 = 2D); so does the gradient buffer,
  // the matrices' gradients stored straight into bf16 and the embedding's added there by its
  // rows (without those two ops it holds any parameter's: via_f32)
  const size_t halved = 4096 + 2 * 2048 + 2 * 1024 + 3 * 3072;  // per token
  const MemoryPlan mh = memory_plan(dm, DType::bf16, 1, 32, full, Use::train);
  Ops via_f32 = full;
  via_f32.embedding_backward_bf16 = nullptr;
  via_f32.matmul_backward_bf16g = nullptr;
  EXPECT_EQ(mh.grads, mb.grads);
  // and attention's stats keep P in bf16 (cpu/gemm.h AttnProbs: at T = 32, per head 16 rows of
  // 32 queries and 16 of 16; and 16 floats of room to align it)
  const int64_t s32 = cpu::attention_stats(1, 32, 16, 8, 128, false),
                s16 = cpu::attention_stats(1, 32, 16, 8, 128, true);
  if (cpu::own_kernels()) {
    EXPECT_EQ(s32, 16 * 32 + 16 + 16 * 768);
    EXPECT_EQ(s16, 16 * 32 + 16 + 16 * 768 / 2);
  } else {
    EXPECT_EQ(s32, 16 * 32);
    EXPECT_EQ(s16, 16 * 32);
  }
  // attention taking QK-norm + RoPE in keeps no q, k, v (per token 2048 + 1024 + 1024) nor their
  // gradients (dq, dk, dv, and the fp32 dqr, dkr of the composition)
  const size_t qkv = 2048 + 1024 + 1024, dqkr = (2048 + 1024) * 4;
  EXPECT_EQ(memory_plan(dm, DType::f32, 1, 32, full, Use::train).activations,
            mp.activations - 8u * 32 * qkv * 4);
  EXPECT_EQ(mh.activations,
            mb.activations - 8u * 32 * (halved + qkv) * 2 - 8u * size_t(s32 - s16) * 4);
  EXPECT_EQ(mh.scratch, mp.scratch - 32u * (halved + qkv) * 2 - 32u * dqkr + (256 + 256) * 4);
  EXPECT_EQ(memory_plan(dm, DType::bf16, 1, 32, via_f32, Use::train).scratch,
            mh.scratch + (2 * 3072 * 256 - 256) * 4);
  // trained by the fused step alone: gradients of the tied embedding (V x C) and the norms
  // (attention, feed-forward, q and k of 8 layers, the final one) only; without the two ops a
  // gradient buffer of the embedding's size
  const size_t unfused = 2048 * 256 + 8 * (256 + 256 + 128 + 128) + 256;
  EXPECT_EQ(memory_plan(dm, DType::f32, 1, 32, full, Use::sgd).grads, unfused * 4);
  const MemoryPlan ms = memory_plan(dm, DType::bf16, 1, 32, full, Use::sgd);
  EXPECT_EQ(ms.grads, unfused * 2);
  EXPECT_EQ(ms.scratch, mh.scratch);
  EXPECT_EQ(memory_plan(dm, DType::bf16, 1, 32, via_f32, Use::sgd).scratch,
            mh.scratch + (2048 * 256 - 256) * 4);
  // an untied head takes its step in its product too
  Config untied = dm;
  untied.tied = false;
  EXPECT_EQ(memory_plan(untied, DType::bf16, 1, 32, full, Use::sgd).grads, unfused * 2);
  EXPECT_EQ(memory_plan(untied, DType::bf16, 1, 32, full, Use::train).grads,
            (31987968u + 2048 * 256) * 2);
}

// A model built for the fused step alone (sgd_only) trains to the same bits as one that keeps
// every gradient, in the memory of the parameters it cannot step inside backward; and refuses
// what would need the other gradients.
TEST(Qwen3, SgdOnlyModelTrainsTheSameInLessMemory) {
  for (DType dt : {DType::f32, DType::bf16})
    for (bool tied : {true, false})
      for (const Ops* ops : {&cpu_ops(), static_cast<const Ops*>(nullptr)}) {
        const Ops bare = test::bare_ops();
        const Ops& o = ops ? *ops : bare;
        const Config c = tiny(tied);
        const std::vector<float> w = tiny_params(c);
        const Batch b = fixed_batch(2, 9, c.V);
        Qwen3 m1(c, dt, 2, 9, o), m2(c, dt, 2, 9, o, Use::sgd);
        m1.set_params(w.data());
        m2.set_params(w.data());
        std::vector<float> p1(w.size()), p2(w.size());
        const std::string what =
            std::string(dtype_name(dt)) + (tied ? " tied " : " untied ") + o.name;
        for (int s = 0; s < 3; ++s) {
          ASSERT_EQ(m1.forward(b), m2.forward(b)) << what << " step " << s;
          m1.backward_sgd(0.3f);
          m2.backward_sgd(0.3f);
          m1.get_params(p1.data());
          m2.get_params(p2.data());
          ASSERT_EQ(p1, p2) << what << " step " << s;
        }
        const bool compact = memory_plan(c, dt, 2, 9, o, Use::sgd).grads <
                             memory_plan(c, dt, 2, 9, o, Use::train).grads;
        EXPECT_EQ(compact, o.matmul_backward_sgd != nullptr) << what;
        if (compact) {
          EXPECT_THROW(m2.backward(), Error) << what;
          EXPECT_THROW(m2.sgd_update(0.1f), Error) << what;
          EXPECT_THROW(m2.get_grads(p2.data()), Error) << what;
        } else {
          m2.backward();  // every gradient kept: the same as m1's
          m1.backward();
          m1.get_grads(p1.data());
          m2.get_grads(p2.data());
          EXPECT_EQ(p1, p2) << what;
        }
      }
}

// TorchTitan's documents in a packed row: one starts at the row's first token and after every
// eos, which ends (and belongs to) the one before it.
TEST(Batch, MarkDocumentsStartsOneAfterEveryEos) {
  Batch b;
  b.B = 3, b.T = 6;
  b.tokens = {5, 0, 0, 7, 8, 0,   // eos inside, twice in a row, and last
              0, 4, 4, 4, 4, 4,   // eos first
              3, 3, 3, 3, 3, 3};  // no eos: one document
  mark_documents(b, 0);
  EXPECT_EQ(b.doc_start,
            (std::vector<int32_t>{0, 0, 2, 3, 3, 3, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0}));
  b.tokens[6] = 9;  // rows are independent: row 1 starts a document whatever row 0 ends with
  mark_documents(b, 0);
  EXPECT_EQ(b.doc_start[6], 0);
  EXPECT_EQ(b.doc_start[7], 0);
}

// Block-causal attention (Batch::doc_start) through the whole model against the reference
// model, on the fast kernels and on the bare table (the composed QK-norm + RoPE and plain
// attention, as CUDA runs it); a batch of one document a row is the causal batch, bit for bit;
// and the mask matters.
TEST(Qwen3, BlockCausalForwardMatchesTheReferenceModel) {
  const Ops bare = test::bare_ops();
  for (const Ops* o : {&cpu_ops(), &bare})
    for (bool tied : {true, false}) {
      const Config c = tiny(tied);
      const std::vector<float> w = tiny_params(c);
      const Batch b = text_batch(3, 21, c.V);
      Qwen3 m(c, DType::f32, 3, 21, *o);
      m.set_params(w.data());
      const double loss = m.forward(b);
      int64_t hits_ref = 0;
      const std::string what = o->name + (tied ? " tied" : " untied");
      EXPECT_NEAR(loss, ref::model_loss(c, w.data(), b, &hits_ref), 1e-5) << what;
      EXPECT_EQ(m.correct(b), hits_ref) << what;
      Batch causal = b;
      causal.doc_start.clear();
      const double lc = m.forward(causal);
      EXPECT_GT(std::fabs(lc - loss), 1e-3) << what;
      causal.doc_start.assign(b.tokens.size(), 0);
      EXPECT_EQ(m.forward(causal), lc) << what;
    }
}

// What block-causal attention means: a row of two documents gives each token the loss it has
// in its own document trained alone (causal, positions from 0), on the fast kernels.
TEST(Qwen3, BlockCausalDocumentsAreSequencesOfTheirOwn) {
  const Config c = tiny(false);
  const std::vector<float> w = tiny_params(c);
  constexpr int32_t eos = 0;
  const std::vector<int32_t> ids = {5, 9, 13, 2, eos, 40, 41, 7, 7, 3, 88, 60, 61};  // T = 12
  const auto loss = [&](int64_t t0, int64_t T, bool docs) {
    Batch b;
    b.B = 1, b.T = T;
    b.tokens.assign(ids.begin() + t0, ids.begin() + t0 + T);
    b.targets.assign(ids.begin() + t0 + 1, ids.begin() + t0 + T + 1);
    if (docs) mark_documents(b, eos);
    Qwen3 m(c, DType::f32, 1, T, cpu_ops());
    m.set_params(w.data());
    return m.forward(b);
  };
  EXPECT_NEAR(loss(0, 12, true), (5 * loss(0, 5, false) + 7 * loss(5, 7, false)) / 12, 1e-5);
}

}  // namespace
}  // namespace tq
