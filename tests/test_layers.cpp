// Every layer: the reference tier against finite differences (double), and the fast CPU
// tier against the reference, forward and backward, over several shapes including odd ones.
#include <gtest/gtest.h>
#include <omp.h>
#include <sched.h>

#include <bit>
#include <cmath>
#include <functional>

#include "cpu/gemm.h"
#include "cpu/layers.h"
#include "model/qwen3.h"
#include "ref/layers.h"
#include "testing.h"

namespace tq {
namespace {

using test::randn;
using test::rel_l2;
using test::to_d;
using test::to_f;
using Vec = std::vector<double>;
using Fwd = std::function<Vec(const std::vector<Vec>&)>;

// J(inputs) = sum(G * f(inputs)); compares analytic dJ/d(input k) with central differences
// at up to 24 positions of every input.
void fd_check(const Fwd& f, std::vector<Vec> in, const Vec& G, const std::vector<Vec>& grad,
              double tol = 1e-6) {
  auto J = [&](const std::vector<Vec>& x) {
    const Vec y = f(x);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += G[i] * y[i];
    return s;
  };
  std::mt19937 rng(7);
  for (size_t k = 0; k < in.size(); ++k) {
    if (grad[k].empty()) continue;
    for (int t = 0; t < 24; ++t) {
      const size_t i = rng() % in[k].size();
      const double h = 1e-5 * std::max(1.0, std::fabs(in[k][i])), x0 = in[k][i];
      in[k][i] = x0 + h;
      const double jp = J(in);
      in[k][i] = x0 - h;
      const double jm = J(in);
      in[k][i] = x0;
      const double num = (jp - jm) / (2 * h);
      EXPECT_NEAR(grad[k][i], num, tol * std::max(1.0, std::fabs(num)))
          << "input " << k << " index " << i;
    }
  }
}

constexpr double kFast = 2e-5;  // fp32 fast tier vs double reference, relative L2

// Block-causal attention's doc_start (Batch, model/qwen3.h) for B rows of T made-up tokens,
// by mark_documents: an eos about every `every` tokens, and rows that test its edges: row 0 (of
// several) one document (no eos), row 1 eos at its first and last tokens, row 2 a run of
// consecutive eos; a single row has all three.
std::vector<int32_t> random_docs(int B, int T, int every, uint32_t seed) {
  constexpr int32_t eos = 0;
  Batch b;
  b.B = B, b.T = T;
  std::mt19937 g(seed);
  for (int r = 0; r < B; ++r) {
    const int kind = B == 1 ? -1 : r % 4;
    for (int t = 0; t < T; ++t) {
      bool end = kind != 0 && int(g() % uint32_t(every)) == 0;
      if (kind == 1 || kind == -1) end |= t == 0 || t == T - 1;
      if (kind == 2 || kind == -1) end |= t >= T / 3 && t < T / 3 + 4;
      b.tokens.push_back(end ? eos : 1);
    }
  }
  mark_documents(b, eos);
  return b.doc_start;
}
// The doc argument of the kernels: null for causal attention (an empty doc_start)
const int32_t* doc_arg(const std::vector<int32_t>& d) {
  return d.empty() ? nullptr : d.data();
}

// ------------------------------------------------------------------ RMSNorm
class RmsNorm : public ::testing::TestWithParam<std::tuple<int, int>> {};
TEST_P(RmsNorm, MatchesReferenceAndFiniteDifferences) {
  const auto [N, C] = GetParam();
  Vec x = randn(N * C, 1), w = randn(C, 2, 0.5), G = randn(N * C, 3);
  for (double& v : w) v += 1.0;
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec y(N * C), r(N);
    ref::rmsnorm_forward(y.data(), r.data(), in[0].data(), in[1].data(), N, C, 1e-6);
    return y;
  };
  Vec y(N * C), r(N), dx(N * C), dw(C, 0.0);
  ref::rmsnorm_forward(y.data(), r.data(), x.data(), w.data(), N, C, 1e-6);
  ref::rmsnorm_backward(dx.data(), dw.data(), G.data(), x.data(), r.data(), w.data(), N, C);
  fd_check(fwd, {x, w}, G, {dx, dw});

  auto xf = to_f(x), wf = to_f(w), Gf = to_f(G);
  std::vector<float> yf(N * C), rf(N), dxf(N * C), dwf(C, 1.0f);
  cpu::rmsnorm_forward(yf.data(), rf.data(), xf.data(), wf.data(), N, C, 1e-6);
  cpu::rmsnorm_backward(dxf.data(), dwf.data(), Gf.data(), xf.data(), rf.data(), wf.data(), N, C);
  for (double& v : dw) v += 1.0;  // parameter grads accumulate
  EXPECT_LT(rel_l2(yf, y), kFast);
  EXPECT_LT(rel_l2(dxf, dx), kFast);
  EXPECT_LT(rel_l2(dwf, dw), kFast);
}
INSTANTIATE_TEST_SUITE_P(Shapes, RmsNorm,
                         ::testing::Values(std::tuple{1, 3}, std::tuple{3, 7}, std::tuple{5, 128},
                                           std::tuple{32, 256}, std::tuple{130, 33}));

// The residual add and the norm after it in one pass (the model's residual stream) against the
// separate passes it stands for, rounding to bf16 after each where rnd: the same bits, dw's
// too, on one thread and on several (rows past the threading threshold, odd widths).
TEST(ResidualNorm, FusedPassesAreTheSeparateOnes) {
  for (const auto& [N, C] : {std::tuple{1, 3}, std::tuple{3, 7}, std::tuple{5, 128},
                             std::tuple{130, 33}, std::tuple{300, 256}, std::tuple{97, 1030}})
    for (bool rnd : {false, true})
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        const std::string what = "N=" + std::to_string(N) + " C=" + std::to_string(C) +
                                 (rnd ? " rounded, " : ", ") + std::to_string(threads) + " threads";
        const auto a = to_f(randn(size_t(N * C), 31)), b = to_f(randn(size_t(N * C), 32)),
                   g = to_f(randn(size_t(N * C), 33)), d0 = to_f(randn(size_t(N * C), 34)),
                   w = to_f(randn(size_t(C), 35, 0.5)), dw0 = to_f(randn(size_t(C), 36));
        const auto round = [&](std::vector<float>& v) {
          if (rnd) cpu::round_bf16_inplace(v.data(), int64_t(v.size()));
        };
        // the separate passes
        std::vector<float> y = a, out(size_t(N * C)), rs(static_cast<size_t>(N)), dw = dw0,
                           dx(size_t(N * C)), dy = d0;
        cpu::add_inplace(y.data(), b.data(), N * C);
        round(y);
        cpu::rmsnorm_forward(out.data(), rs.data(), y.data(), w.data(), N, C, 1e-6);
        round(out);
        cpu::rmsnorm_backward(dx.data(), dw.data(), g.data(), y.data(), rs.data(), w.data(), N, C);
        round(dx);
        cpu::add_inplace(dy.data(), dx.data(), N * C);
        round(dy);
        // fused
        std::vector<float> y2(size_t(N * C)), out2(size_t(N * C)), rs2(static_cast<size_t>(N)),
            dw2 = dw0, dy2 = d0;
        cpu::add_rmsnorm_forward(y2.data(), out2.data(), rs2.data(), a.data(), b.data(), w.data(),
                                 N, C, 1e-6, rnd);
        cpu::rmsnorm_backward_add(dy2.data(), dw2.data(), g.data(), y2.data(), rs2.data(), w.data(),
                                  N, C, rnd);
        ASSERT_EQ(y2, y) << what;
        ASSERT_EQ(out2, out) << what;
        ASSERT_EQ(rs2, rs) << what;
        ASSERT_EQ(dy2, dy) << what;
        ASSERT_EQ(dw2, dw) << what;
        // y may be a (the add in place)
        std::vector<float> y3 = a;
        cpu::add_rmsnorm_forward(y3.data(), out2.data(), rs2.data(), y3.data(), b.data(), w.data(),
                                 N, C, 1e-6, rnd);
        ASSERT_EQ(y3, y) << what << ", in place";
      }
  omp_set_num_threads(cpu::threads());
}

// ------------------------------------------------------------------ matmul
class Matmul : public ::testing::TestWithParam<std::tuple<int, int, int>> {};
TEST_P(Matmul, MatchesReferenceAndFiniteDifferences) {
  const auto [N, IC, OC] = GetParam();
  Vec x = randn(N * IC, 1), W = randn(OC * IC, 2, 0.1), G = randn(N * OC, 3);
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec y(N * OC);
    ref::matmul_forward(y.data(), in[0].data(), in[1].data(), N, IC, OC);
    return y;
  };
  Vec y(N * OC), dx(N * IC), dW(OC * IC, 0.0);
  ref::matmul_forward(y.data(), x.data(), W.data(), N, IC, OC);
  ref::matmul_backward(dx.data(), dW.data(), G.data(), x.data(), W.data(), N, IC, OC);
  fd_check(fwd, {x, W}, G, {dx, dW});

  auto xf = to_f(x), Wf = to_f(W), Gf = to_f(G);
  std::vector<float> yf(N * OC), dxf(N * IC, 9.0f), dWf(OC * IC, 0.5f);
  cpu::matmul_forward(yf.data(), xf.data(), Wf.data(), N, IC, OC);
  cpu::matmul_backward(dxf.data(), dWf.data(), Gf.data(), xf.data(), Wf.data(), N, IC, OC);
  for (double& v : dW) v += 0.5;
  EXPECT_LT(rel_l2(yf, y), kFast);
  EXPECT_LT(rel_l2(dxf, dx), kFast);  // overwritten, not accumulated
  EXPECT_LT(rel_l2(dWf, dW), kFast);
}
INSTANTIATE_TEST_SUITE_P(Shapes, Matmul,
                         ::testing::Values(std::tuple{1, 1, 1}, std::tuple{3, 5, 7},
                                           std::tuple{17, 33, 65}, std::tuple{32, 256, 100},
                                           std::tuple{64, 19, 300}));

// ------------------------------------------------------------------ attention (+ RoPE)
struct AttnShape {
  int B, T, H, KVH, D;
  int every = 0;  // 0: causal; else block-causal, an eos about every `every` tokens (random_docs)
};
class Attention : public ::testing::TestWithParam<AttnShape> {};
TEST_P(Attention, MatchesReferenceAndFiniteDifferences) {
  const auto [B, T, H, KVH, D, every] = GetParam();
  const int nq = B * T * H * D, nk = B * T * KVH * D;
  const std::vector<int32_t> docs = every ? random_docs(B, T, every, 9) : std::vector<int32_t>();
  const int32_t* doc = doc_arg(docs);
  Vec q = randn(nq, 1), k = randn(nk, 2), v = randn(nk, 3), G = randn(nq, 4);
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec o(nq), lse(B * H * T);
    ref::attention_forward(o.data(), lse.data(), in[0].data(), in[1].data(), in[2].data(), B, T, H,
                           KVH, D, doc);
    return o;
  };
  Vec o(nq), lse(B * H * T), dq(nq), dk(nk), dv(nk);
  ref::attention_forward(o.data(), lse.data(), q.data(), k.data(), v.data(), B, T, H, KVH, D, doc);
  ref::attention_backward(dq.data(), dk.data(), dv.data(), G.data(), o.data(), lse.data(), q.data(),
                          k.data(), v.data(), B, T, H, KVH, D, doc);
  fd_check(fwd, {q, k, v}, G, {dq, dk, dv});
  // the mask: the first output of every head (block-causal: of every document) only sees v there
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      if (doc ? doc[b * T + t] == t : t == 0) {
        for (int h = 0; h < H; ++h)
          for (int e = 0; e < D; ++e)
            EXPECT_NEAR(o[((b * T + t) * H + h) * D + e],
                        v[((b * T + t) * KVH + h / (H / KVH)) * D + e], 1e-12);
      }

  auto qf = to_f(q), kf = to_f(k), vf = to_f(v), Gf = to_f(G);
  const auto lse_of = [&](const std::vector<float>& stats) {  // its first B H T floats
    return std::vector<float>(stats.begin(), stats.begin() + B * H * T);
  };
  std::vector<float> of(nq), lsef(cpu::attention_stats(B, T, H, KVH, D, false)), dqf(nq, 3.0f),
      dkf(nk, 3.0f), dvf(nk, 3.0f);
  cpu::attention_forward(of.data(), lsef.data(), qf.data(), kf.data(), vf.data(), B, T, H, KVH, D,
                         doc);
  cpu::attention_backward(dqf.data(), dkf.data(), dvf.data(), Gf.data(), of.data(), lsef.data(),
                          qf.data(), kf.data(), vf.data(), B, T, H, KVH, D, doc);
  EXPECT_LT(rel_l2(of, o), kFast);
  EXPECT_LT(rel_l2(lse_of(lsef), lse), kFast);
  EXPECT_LT(rel_l2(dqf, dq), kFast);
  EXPECT_LT(rel_l2(dkf, dk), kFast);
  EXPECT_LT(rel_l2(dvf, dv), kFast);

  // bf16 products (bf16 runs): on bf16 inputs, P and dS rounded to bf16 inside; the
  // reference is exact attention of those inputs
  if (!cpu::own_kernels()) return;
  for (auto* x : {&qf, &kf, &vf, &Gf}) cpu::round_bf16_inplace(x->data(), int64_t(x->size()));
  const Vec qr = to_d(qf), kr = to_d(kf), vr = to_d(vf), Gr = to_d(Gf);
  ref::attention_forward(o.data(), lse.data(), qr.data(), kr.data(), vr.data(), B, T, H, KVH, D,
                         doc);
  ref::attention_backward(dq.data(), dk.data(), dv.data(), Gr.data(), o.data(), lse.data(),
                          qr.data(), kr.data(), vr.data(), B, T, H, KVH, D, doc);
  std::fill(dqf.begin(), dqf.end(), 3.0f), std::fill(dkf.begin(), dkf.end(), 3.0f),
      std::fill(dvf.begin(), dvf.end(), 3.0f);
  lsef.assign(size_t(cpu::attention_stats(B, T, H, KVH, D, true)), 0.0f);
  cpu::attention_forward_bf16(of.data(), lsef.data(), qf.data(), kf.data(), vf.data(), B, T, H, KVH,
                              D, false, doc);
  cpu::attention_backward_bf16(dqf.data(), dkf.data(), dvf.data(), Gf.data(), of.data(),
                               lsef.data(), qf.data(), kf.data(), vf.data(), B, T, H, KVH, D, false,
                               doc);
  constexpr double kBf16 = 1e-2;  // bf16 rounding of P and dS: 2^-9 relative each
  EXPECT_LT(rel_l2(of, o), kBf16);
  EXPECT_LT(rel_l2(lse_of(lsef), lse), kFast);  // scores are exact products of bf16 values
  EXPECT_LT(rel_l2(dqf, dq), kBf16);
  EXPECT_LT(rel_l2(dkf, dk), kBf16);
  EXPECT_LT(rel_l2(dvf, dv), kBf16);
}
// (the last ones block-causal: documents of about 1, 3, 4 and 20 tokens)
INSTANTIATE_TEST_SUITE_P(Shapes, Attention,
                         ::testing::Values(AttnShape{1, 1, 1, 1, 2}, AttnShape{2, 5, 4, 2, 8},
                                           AttnShape{3, 7, 6, 3, 4}, AttnShape{2, 9, 4, 4, 6},
                                           AttnShape{1, 6, 8, 1, 2}, AttnShape{1, 33, 4, 2, 16},
                                           AttnShape{2, 70, 2, 1, 4}, AttnShape{1, 130, 4, 2, 8},
                                           AttnShape{1, 1, 1, 1, 2, 1}, AttnShape{4, 9, 4, 2, 6, 3},
                                           AttnShape{3, 33, 4, 2, 16, 4},
                                           AttnShape{4, 130, 2, 1, 8, 20}));

// The probabilities a forward of the kernels saved in stats (AttnProbs), each checked against
// exp(q k / sqrt(D) - lse) of the reference (to tol), 0 where masked; returned in the layout's
// order, as fp32. Block-causal (doc), the rows from each block's first query's first key.
std::vector<float> saved_probs(const float* stats, bool bf, const AttnShape& sh, const Vec& q,
                               const Vec& k, const Vec& lse, double tol, const std::string& what,
                               const int32_t* doc) {
  const auto [B, T, H, KVH, D, every] = sh;
  const cpu::AttnProbs pr(T);
  const void* P = cpu::AttnProbs::probs(stats, B, T, H);
  std::vector<float> all;
  int bad = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int q0 = 0; q0 < T; q0 += int(cpu::kAttnQB)) {
        const int nq = std::min(int(cpu::kAttnQB), T - q0);
        for (int j = doc ? doc[b * T + q0] : 0; j < q0 + nq; ++j)
          for (int c = int(cpu::AttnProbs::first(j, q0)); c < nq; ++c) {
            const int64_t at = (int64_t(b) * H + h) * pr.per_head() + pr.row(q0, j) -
                               cpu::AttnProbs::first(j, q0) + c;
            const float p =
                bf ? std::bit_cast<float>(uint32_t(static_cast<const uint16_t*>(P)[at]) << 16)
                   : static_cast<const float*>(P)[at];
            const int i = q0 + c;
            double want = 0.0;
            if (j <= i && (!doc || doc[b * T + i] <= j)) {
              double s = 0.0;
              for (int d = 0; d < D; ++d)
                s += q[((int64_t(b) * T + i) * H + h) * D + d] *
                     k[((int64_t(b) * T + j) * KVH + h / (H / KVH)) * D + d];
              want = std::exp(s / std::sqrt(double(D)) - lse[(b * H + h) * T + i]);
            }
            if (!(std::fabs(p - want) <= tol) && ++bad <= 3)
              ADD_FAILURE() << what << ": saved P(query " << i << ", key " << j << ") of head " << h
                            << " is " << p << ", want " << want;
            all.push_back(p);
          }
      }
  return all;
}

// Attention on every kernel set this CPU can run (cpu/attention_driver.h), at shapes with
// several query blocks, head dims that are no multiple of a tile and the model's own, causal and
// block-causal (documents shorter and longer than a tile): against the reference (fp32; the
// bf16 kind on bf16 inputs, and bit for bit the same with every activation in bf16 storage),
// the probabilities it saves for the backward too, and bit for bit at 1, 2 and 3 threads
// (threads claim tasks one ahead: some shapes have fewer tasks than threads).
TEST(AttentionKernels, MatchReferenceOnEverySetAndAnyThreadCount) {
  // P saved where it is no larger than q, k, v and out (about T <= 4 (H + KVH) D / H): the
  // first and last shapes save it, the other two recompute it (T = 97: 106 but for the
  // padding of its short block; T = 300 > 264)
  EXPECT_TRUE(cpu::AttnProbs(200).saves(4, 2, 128) && cpu::AttnProbs(16).saves(2, 1, 7));
  EXPECT_FALSE(cpu::AttnProbs(97).saves(3, 1, 20) || cpu::AttnProbs(300).saves(2, 2, 33));
  for (const AttnShape sh :
       {AttnShape{1, 200, 4, 2, 128}, AttnShape{2, 97, 3, 1, 20}, AttnShape{1, 300, 2, 2, 33},
        AttnShape{3, 16, 2, 1, 7}, AttnShape{3, 200, 4, 2, 128, 23}, AttnShape{4, 97, 3, 1, 20, 9},
        AttnShape{3, 300, 2, 2, 33, 50}, AttnShape{4, 16, 2, 1, 7, 3}}) {
    const auto [B, T, H, KVH, D, every] = sh;
    const std::vector<int32_t> docs = every ? random_docs(B, T, every, 11) : std::vector<int32_t>();
    const int32_t* doc = doc_arg(docs);
    const int nq = B * T * H * D, nk = B * T * KVH * D;
    for (const cpu::Isa isa : {cpu::Isa::avx2, cpu::Isa::avx512}) {
      const cpu::GemmSet* set = cpu::gemm_set(isa);
      if (!set) continue;
      for (const int bf : {0, 1}) {
        std::vector<float> qf = to_f(randn(nq, 1)), kf = to_f(randn(nk, 2)),
                           vf = to_f(randn(nk, 3)), Gf = to_f(randn(nq, 4));
        if (bf)
          for (auto* x : {&qf, &kf, &vf, &Gf})
            cpu::round_bf16_inplace(x->data(), int64_t(x->size()));
        Vec o(nq), lse(B * H * T), dq(nq), dk(nk), dv(nk);
        ref::attention_forward(o.data(), lse.data(), to_d(qf).data(), to_d(kf).data(),
                               to_d(vf).data(), B, T, H, KVH, D, doc);
        ref::attention_backward(dq.data(), dk.data(), dv.data(), to_d(Gf).data(), o.data(),
                                lse.data(), to_d(qf).data(), to_d(kf).data(), to_d(vf).data(), B, T,
                                H, KVH, D, doc);
        std::vector<float> out[3], grads[3];
        for (const int threads : {3, 2, 1}) {
          omp_set_num_threads(threads);
          const bool saves = cpu::AttnProbs(T).saves(H, KVH, D);
          std::vector<float> of(nq), stats(cpu::AttnProbs::stats_floats(B, T, H, KVH, D, bf)),
              dqf(nq, 3.0f), dkf(nk, 3.0f), dvf(nk, 3.0f);
          set->attn_fwd[bf](of.data(), stats.data(), qf.data(), kf.data(), vf.data(), B, T, H, KVH,
                            D, doc, nullptr);
          const std::string what = std::string(set->name) + (bf ? " bf16" : " f32") +
                                   " T=" + std::to_string(T) + " D=" + std::to_string(D) +
                                   (doc ? " block-causal" : "");
          const std::vector<float> lsef(stats.begin(), stats.begin() + B * H * T),
              probs = saves ? saved_probs(stats.data(), bf, sh, to_d(qf), to_d(kf), lse,
                                          bf ? 1.0 / 256 : 1e-5, what, doc)
                            : std::vector<float>();
          // where P is saved the backward reads only it: garbage in the lse would show
          if (saves) std::fill(stats.begin(), stats.begin() + B * H * T, NAN);
          set->attn_bwd[bf](dqf.data(), dkf.data(), dvf.data(), Gf.data(), of.data(), stats.data(),
                            qf.data(), kf.data(), vf.data(), B, T, H, KVH, D, doc, nullptr);
          const double tol = bf ? 1e-2 : kFast;
          EXPECT_LT(rel_l2(of, o), tol) << what;
          EXPECT_LT(rel_l2(lsef, lse), kFast) << what;
          EXPECT_LT(rel_l2(dqf, dq), tol) << what;
          EXPECT_LT(rel_l2(dkf, dk), tol) << what;  // overwritten, not accumulated
          EXPECT_LT(rel_l2(dvf, dv), tol) << what;
          for (const auto* x : {&of, &dqf, &dkf, &dvf}) {  // bf16 kind: outputs stored rounded
            const bool rounded =
                std::all_of(x->begin(), x->end(), [](float f) { return f == round_bf16(f); });
            EXPECT_TRUE(rounded || !bf) << what << ": an output is not a bf16 value";
          }
          if (bf) {  // [2], every activation in bf16 storage: the same bits
            const auto to16 = [](const std::vector<float>& x) {
              std::vector<uint16_t> h(x.size());
              for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_bf16(x[i]);
              return h;
            };
            const auto f = [](std::vector<uint16_t>& h) {
              return reinterpret_cast<float*>(h.data());
            };
            std::vector<uint16_t> q16 = to16(qf), k16 = to16(kf), v16 = to16(vf), G16 = to16(Gf),
                                  o16(nq, 1), dq16(nq, 1), dk16(nk, 1), dv16(nk, 1);
            std::vector<float> st16(stats.size());
            set->attn_fwd[2](f(o16), st16.data(), f(q16), f(k16), f(v16), B, T, H, KVH, D, doc,
                             nullptr);
            EXPECT_TRUE(std::equal(lsef.begin(), lsef.end(), st16.begin()))
                << what << " in bf16 storage";
            if (saves) {
              EXPECT_EQ(
                  saved_probs(st16.data(), true, sh, to_d(qf), to_d(kf), lse, 1.0 / 256, what, doc),
                  probs)
                  << what << " in bf16 storage";
            }
            set->attn_bwd[2](f(dq16), f(dk16), f(dv16), f(G16), f(o16), st16.data(), f(q16), f(k16),
                             f(v16), B, T, H, KVH, D, doc, nullptr);
            EXPECT_EQ(o16, to16(of)) << what << " in bf16 storage";
            EXPECT_EQ(dq16, to16(dqf)) << what << " in bf16 storage";
            EXPECT_EQ(dk16, to16(dkf)) << what << " in bf16 storage";
            EXPECT_EQ(dv16, to16(dvf)) << what << " in bf16 storage";
          }
          out[threads - 1] = of;
          out[threads - 1].insert(out[threads - 1].end(), lsef.begin(), lsef.end());
          out[threads - 1].insert(out[threads - 1].end(), probs.begin(), probs.end());
          grads[threads - 1] = dqf;
          grads[threads - 1].insert(grads[threads - 1].end(), dkf.begin(), dkf.end());
          grads[threads - 1].insert(grads[threads - 1].end(), dvf.begin(), dvf.end());
        }
        omp_set_num_threads(cpu::threads());
        EXPECT_TRUE(out[0] == out[1] && grads[0] == grads[1] && out[0] == out[2] &&
                    grads[0] == grads[2])
            << set->name << (doc ? " block-causal" : "") << ": differs between 1, 2 and 3 threads";
      }
    }
  }
}

// (the fifth: 0, positions 0..T-1; else block-causal positions, each document's from 0, for
// documents of about that many tokens: random_docs)
class Rope : public ::testing::TestWithParam<std::tuple<int, int, int, int, int>> {};
TEST_P(Rope, MatchesReferenceAndFiniteDifferences) {
  const auto [B, T, NH, D, every] = GetParam();
  const int n = B * T * NH * D;
  const std::vector<int32_t> docs = every ? random_docs(B, T, every, 3) : std::vector<int32_t>();
  const int32_t* doc = doc_arg(docs);
  std::vector<float> cs, sn;
  rope_tables(cs, sn, T, D, 1e6);
  Vec x = randn(n, 1), G = randn(n, 2);
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec y(n);
    ref::rope_forward(y.data(), in[0].data(), cs.data(), sn.data(), B, T, NH, D, doc);
    return y;
  };
  Vec y(n), dx(n);
  ref::rope_forward(y.data(), x.data(), cs.data(), sn.data(), B, T, NH, D, doc);
  ref::rope_backward(dx.data(), G.data(), cs.data(), sn.data(), B, T, NH, D, doc);
  fd_check(fwd, {x}, G, {dx});
  // token t of row b rotated by the angles of its position: t, or t - its document's start
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const int p = doc ? t - doc[b * T + t] : t, base = (b * T + t) * NH * D, D2 = D / 2;
      for (int e = 0; e < D2; ++e)
        EXPECT_NEAR(y[base + e], x[base + e] * cs[p * D2 + e] - x[base + e + D2] * sn[p * D2 + e],
                    1e-12);
    }
  auto xf = to_f(x), Gf = to_f(G);
  std::vector<float> yf(n), dxf(n);
  cpu::rope_forward(yf.data(), xf.data(), cs.data(), sn.data(), B, T, NH, D, doc);
  cpu::rope_backward(dxf.data(), Gf.data(), cs.data(), sn.data(), B, T, NH, D, doc);
  EXPECT_LT(rel_l2(yf, y), kFast);
  EXPECT_LT(rel_l2(dxf, dx), kFast);
  cpu::rope_forward(xf.data(), xf.data(), cs.data(), sn.data(), B, T, NH, D, doc);  // in place
  EXPECT_EQ(xf, yf);
}
INSTANTIATE_TEST_SUITE_P(Shapes, Rope,
                         ::testing::Values(std::tuple{1, 1, 1, 2, 0}, std::tuple{2, 5, 3, 8, 0},
                                           std::tuple{1, 32, 4, 128, 0}, std::tuple{3, 3, 2, 6, 0},
                                           std::tuple{4, 9, 3, 8, 3},
                                           std::tuple{1, 32, 4, 128, 6}));

TEST(RopeTables, MatchTorchInvFreqAndPositions) {
  std::vector<float> cs, sn;
  rope_tables(cs, sn, 4, 128, 1e6);
  // torch 1.13 inv_freq[1] = 0x3f4e4bad (spec §5); at position 1 the angle is inv_freq itself
  EXPECT_NEAR(std::acos(double(cs[64 + 1])), 0.80584222, 1e-6);
  EXPECT_FLOAT_EQ(cs[0], 1.0f);
  EXPECT_FLOAT_EQ(sn[0], 0.0f);
  EXPECT_NEAR(sn[64], std::sin(1.0), 1e-7);  // inv_freq[0] = 1
}

// ------------------------------------------------------------------ SwiGLU
class SwiGlu : public ::testing::TestWithParam<std::tuple<int, int>> {};
TEST_P(SwiGlu, MatchesReferenceAndFiniteDifferences) {
  const auto [N, F] = GetParam();
  Vec ab = randn(N * 2 * F, 1, 2.0), G = randn(N * F, 2);
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec y(N * F);
    ref::swiglu_forward(y.data(), in[0].data(), N, F);
    return y;
  };
  Vec y(N * F), dab(N * 2 * F);
  ref::swiglu_forward(y.data(), ab.data(), N, F);
  ref::swiglu_backward(dab.data(), G.data(), ab.data(), N, F);
  fd_check(fwd, {ab}, G, {dab});
  auto abf = to_f(ab), Gf = to_f(G);
  std::vector<float> yf(N * F), dabf(N * 2 * F);
  cpu::swiglu_forward(yf.data(), abf.data(), N, F, false);
  cpu::swiglu_backward(dabf.data(), Gf.data(), abf.data(), N, F, false);
  EXPECT_LT(rel_l2(yf, y), kFast);
  EXPECT_LT(rel_l2(dabf, dab), kFast);
  // The backward's 1 + x (1 - sg) is one fma, written out: left to GCC it is fused or not by
  // the shape of the code around it. Every da and db bit for bit against the formula.
  for (int n = 0; n < N; ++n)
    for (int f = 0; f < F; ++f) {
      const float x = abf[n * 2 * F + f], b = abf[n * 2 * F + F + f], g = Gf[n * F + f];
      const float sg = 1.0f / (1.0f + cpu::exp_for_tests(-x));
      ASSERT_EQ(dabf[n * 2 * F + f], g * b * sg * std::fma(x, 1.0f - sg, 1.0f)) << n << "," << f;
      ASSERT_EQ(dabf[n * 2 * F + F + f], g * x * sg) << n << "," << f;
    }
  // rnd: the same values, stored rounded to bf16
  std::vector<float> yr(N * F), dabr(N * 2 * F);
  cpu::swiglu_forward(yr.data(), abf.data(), N, F, true);
  cpu::swiglu_backward(dabr.data(), Gf.data(), abf.data(), N, F, true);
  cpu::round_bf16_inplace(yf.data(), N * F);
  cpu::round_bf16_inplace(dabf.data(), N * 2 * F);
  EXPECT_EQ(yr, yf);
  EXPECT_EQ(dabr, dabf);
  // bf16 storage (bf16 runs' feed-forward activations): the bits of the rounded pass above on
  // the same bf16 inputs
  cpu::round_bf16_inplace(abf.data(), N * 2 * F);
  cpu::round_bf16_inplace(Gf.data(), N * F);
  cpu::swiglu_forward(yr.data(), abf.data(), N, F, true);
  cpu::swiglu_backward(dabr.data(), Gf.data(), abf.data(), N, F, true);
  std::vector<uint16_t> ab16(abf.size()), G16(Gf.size()), y16(yr.size()), dab16(dabr.size());
  for (size_t i = 0; i < ab16.size(); ++i) ab16[i] = f32_to_bf16(abf[i]);
  for (size_t i = 0; i < G16.size(); ++i) G16[i] = f32_to_bf16(Gf[i]);
  cpu::swiglu_forward_bf16(y16.data(), ab16.data(), N, F);
  cpu::swiglu_backward_bf16(dab16.data(), G16.data(), ab16.data(), N, F);
  for (size_t i = 0; i < y16.size(); ++i) ASSERT_EQ(y16[i], f32_to_bf16(yr[i])) << "out " << i;
  for (size_t i = 0; i < dab16.size(); ++i)
    ASSERT_EQ(dab16[i], f32_to_bf16(dabr[i])) << "dab " << i;
}
INSTANTIATE_TEST_SUITE_P(Shapes, SwiGlu,
                         ::testing::Values(std::tuple{1, 1}, std::tuple{3, 17},
                                           std::tuple{32, 3072}, std::tuple{65, 40}));

// ------------------------------------------------------------------ cross-entropy
class CrossEntropy : public ::testing::TestWithParam<std::tuple<int, int>> {};
TEST_P(CrossEntropy, MatchesReferenceAndFiniteDifferences) {
  const auto [N, V] = GetParam();
  Vec logits = randn(N * V, 1, 3.0);
  std::vector<int32_t> tgt(N);
  for (int n = 0; n < N; ++n) tgt[n] = (n * 7 + 3) % V;
  Vec lse(N), d(N * V);
  const double loss = ref::crossentropy_forward(lse.data(), logits.data(), tgt.data(), N, V);
  ref::crossentropy_backward(d.data(), logits.data(), lse.data(), tgt.data(), N, V, 1.0 / N);
  // J = loss itself: use a one-element "output" with G = 1
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec l(N);
    return Vec{ref::crossentropy_forward(l.data(), in[0].data(), tgt.data(), N, V)};
  };
  fd_check(fwd, {logits}, Vec{1.0}, {d});
  // direct log-softmax definition
  double direct = 0;
  for (int n = 0; n < N; ++n) {
    double s = 0;
    for (int j = 0; j < V; ++j) s += std::exp(logits[n * V + j]);
    direct += std::log(s) - logits[n * V + tgt[n]];
  }
  EXPECT_NEAR(loss, direct / N, 1e-12);
  auto lf = to_f(logits);
  std::vector<float> lsef(N);
  const double lossf = cpu::crossentropy_forward(lsef.data(), lf.data(), tgt.data(), N, V);
  EXPECT_NEAR(lossf, loss, 1e-5 * std::fabs(loss));
  cpu::crossentropy_backward(lf.data(), lf.data(), lsef.data(), tgt.data(), N, V, 1.0 / N);
  EXPECT_LT(rel_l2(lf, d), kFast);  // in place
}
INSTANTIATE_TEST_SUITE_P(Shapes, CrossEntropy,
                         ::testing::Values(std::tuple{1, 2}, std::tuple{5, 11},
                                           std::tuple{32, 2048}, std::tuple{7, 1000}));

// ------------------------------------------------------------------ threads
TEST(Threads, DefaultIsTheCpusThisProcessMayUse) {
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  const int n = cpu::available_cpus();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, CPU_COUNT(&set));  // (a cgroup quota may lower it further)
  EXPECT_EQ(cpu::cpus_in_quota("max 100000\n", 8), 8);
  EXPECT_EQ(cpu::cpus_in_quota("200000 100000\n", 8), 2);
  EXPECT_EQ(cpu::cpus_in_quota("150000 100000", 8), 2);  // part of a CPU: a thread for it
  EXPECT_EQ(cpu::cpus_in_quota("50000 100000", 8), 1);
  EXPECT_EQ(cpu::cpus_in_quota("1600000 100000", 8), 8);  // the mask is the smaller
  EXPECT_EQ(cpu::cpus_in_quota("", 4), 4);
  EXPECT_EQ(cpu::cpus_in_quota("garbage", 4), 4);
}

// ------------------------------------------------------------------ embedding, qkv split
TEST(Embedding, GathersAndScatterAddsRepeatedTokens) {
  const int N = 6, C = 5, V = 4;
  const std::vector<int32_t> tok = {0, 3, 3, 1, 0, 3};
  Vec E = randn(V * C, 1), G = randn(N * C, 2);
  auto fwd = [&](const std::vector<Vec>& in) {
    Vec y(N * C);
    ref::embedding_forward(y.data(), tok.data(), in[0].data(), N, C);
    return y;
  };
  Vec dE(V * C, 0.0);
  ref::embedding_backward(dE.data(), G.data(), tok.data(), N, C);
  fd_check(fwd, {E}, G, {dE});
  auto Ef = to_f(E), Gf = to_f(G);
  std::vector<float> yf(N * C), dEf(V * C, 1.0f);
  cpu::embedding_forward(yf.data(), tok.data(), Ef.data(), N, C);
  cpu::embedding_backward(dEf.data(), Gf.data(), tok.data(), N, C);
  for (double& v : dE) v += 1.0;
  EXPECT_LT(rel_l2(yf, fwd({E})), 1e-7);
  EXPECT_LT(rel_l2(dEf, dE), 1e-6);
  for (int c = 0; c < C; ++c) EXPECT_DOUBLE_EQ(dE[2 * C + c], 1.0);  // unused token
  // from a bf16 table: the rows it gathers widened exactly, as the whole table widened gives
  std::vector<uint16_t> E16(V * C);
  std::vector<float> Ew(V * C), y16(N * C, NAN), yw(N * C);
  for (int i = 0; i < V * C; ++i) E16[i] = f32_to_bf16(Ef[i]), Ew[i] = bf16_to_f32(E16[i]);
  cpu::embedding_forward_bf16(y16.data(), tok.data(), E16.data(), N, C);
  cpu::embedding_forward(yw.data(), tok.data(), Ew.data(), N, C);
  EXPECT_EQ(y16, yw);
}

// Into a bf16 gradient: the bits of the model's composition (embedding_backward into a zeroed
// fp32 table, then bf16_accumulate), with tokens repeated and unused, on one thread and on
// several (more rows than a thread's share), the rows no token hits left as they were.
TEST(Embedding, Bf16GradientIsTheZeroedTableAddedWithOneRounding) {
  for (const auto& [N, C, V] :
       {std::tuple{6, 5, 4}, std::tuple{2048, 256, 2048}, std::tuple{300, 1030, 7}}) {
    std::vector<int32_t> tok(static_cast<size_t>(N));
    for (int n = 0; n < N; ++n) tok[size_t(n)] = int32_t((n * 7 + n / 3) % V);
    tok[1] = tok[2] = tok[size_t(N - 1)] = 1;  // repeats (the first case misses row 3)
    const std::vector<float> G = to_f(randn(size_t(N * C), 21));
    std::vector<uint16_t> start(size_t(V * C));
    const std::vector<float> s0 = to_f(randn(size_t(V * C), 22));
    for (size_t i = 0; i < start.size(); ++i) start[i] = f32_to_bf16(s0[i]);
    std::vector<float> table(size_t(V * C), 0.0f);
    cpu::embedding_backward(table.data(), G.data(), tok.data(), N, C);
    std::vector<uint16_t> want = start;
    cpu_ops().bf16_accumulate(want.data(), table.data(), int64_t(table.size()));
    for (int threads : {1, 3}) {
      omp_set_num_threads(threads);
      std::vector<uint16_t> got = start;
      cpu::embedding_backward_bf16(got.data(), G.data(), tok.data(), N, C);
      ASSERT_EQ(got, want) << "N=" << N << " C=" << C << ", " << threads << " threads";
    }
    omp_set_num_threads(cpu::threads());
  }
}

TEST(QkvSplit, FollowsTheFusedRowLayoutAndRoundTrips) {
  const int N = 3, H = 4, KVH = 2, D = 3, R = (H + 2 * KVH) * D;
  std::vector<float> qkv(N * R);
  for (int i = 0; i < N * R; ++i) qkv[i] = float(i);
  std::vector<float> q(N * H * D), k(N * KVH * D), v(N * KVH * D), back(N * R);
  cpu::qkv_split_forward(q.data(), k.data(), v.data(), qkv.data(), N, H, KVH, D);
  // group 1 of row 2: q heads 2,3 then k head 1 then v head 1 (spec §3)
  EXPECT_EQ(q[(2 * H + 3) * D + 1], qkv[2 * R + (1 * 4 + 1) * D + 1]);
  EXPECT_EQ(k[(2 * KVH + 1) * D], qkv[2 * R + (1 * 4 + 2) * D]);
  EXPECT_EQ(v[(2 * KVH + 1) * D + 2], qkv[2 * R + (1 * 4 + 3) * D + 2]);
  std::vector<double> qd(q.size()), kd(k.size()), vd(v.size());
  ref::qkv_split_forward(qd.data(), kd.data(), vd.data(), to_d(qkv).data(), N, H, KVH, D);
  EXPECT_EQ(to_f(qd), q);
  EXPECT_EQ(to_f(kd), k);
  EXPECT_EQ(to_f(vd), v);
  cpu::qkv_split_backward(back.data(), q.data(), k.data(), v.data(), N, H, KVH, D);
  EXPECT_EQ(back, qkv);
}

// The bf16-weight products (bf16 runs, our kernels only) store out and dx rounded to bf16: the
// model skips its own rounding pass after them (ops.h). Against the same product unrounded,
// then rounded.
// The fused QK-norm + RoPE pass is the split, the two norms and the two rotations (and, for
// bf16 runs, the rounding after each): the same bits, the norm weights' gradients to their
// sums' order.
class QkNormRope : public ::testing::TestWithParam<std::tuple<int, int, int, int, int, int>> {};
TEST_P(QkNormRope, EqualsTheSplitNormsAndRotations) {
  const auto [B, T, H, KVH, D, every] = GetParam();  // (every as in Rope)
  const int64_t N = B * T, HD = N * H * D, KD = N * KVH * D, R = (H + 2 * KVH) * D;
  const std::vector<int32_t> docs = every ? random_docs(B, T, every, 4) : std::vector<int32_t>();
  const int32_t* doc = doc_arg(docs);
  std::vector<float> cs, sn;
  rope_tables(cs, sn, T, D, 1e4);
  const std::vector<float> qkv = to_f(randn(N * R, 1)), w = to_f(randn(2 * D, 2, 0.3)),
                           dq = to_f(randn(HD, 3)), dk = to_f(randn(KD, 4)),
                           dv = to_f(randn(KD, 5));
  const float *qw = w.data(), *kw = w.data() + D;
  for (bool rnd : {false, true}) {
    auto rb = [&](std::vector<float>& x) {
      if (rnd) cpu::round_bf16_inplace(x.data(), int64_t(x.size()));
    };
    std::vector<float> dvi = dv;  // a bf16 run's dv holds bf16 values
    rb(dvi);
    // unfused
    std::vector<float> qr(HD), kr(KD), v(KD), q(HD), k(KD), qrs(N * H), krs(N * KVH);
    cpu::qkv_split_forward(qr.data(), kr.data(), v.data(), qkv.data(), N, H, KVH, D);
    cpu::rmsnorm_forward(q.data(), qrs.data(), qr.data(), qw, N * H, D, 1e-6);
    cpu::rmsnorm_forward(k.data(), krs.data(), kr.data(), kw, N * KVH, D, 1e-6);
    rb(q), rb(k);
    cpu::rope_forward(q.data(), q.data(), cs.data(), sn.data(), B, T, H, D, doc);
    cpu::rope_forward(k.data(), k.data(), cs.data(), sn.data(), B, T, KVH, D, doc);
    rb(q), rb(k);
    std::vector<float> gq = dq, gk = dk, dqr(HD), dkr(KD), dqkv(N * R), dw(2 * D, 0.5f);
    cpu::rope_backward(gq.data(), gq.data(), cs.data(), sn.data(), B, T, H, D, doc);
    cpu::rope_backward(gk.data(), gk.data(), cs.data(), sn.data(), B, T, KVH, D, doc);
    rb(gq), rb(gk);
    cpu::rmsnorm_backward(dqr.data(), dw.data(), gq.data(), qr.data(), qrs.data(), qw, N * H, D);
    cpu::rmsnorm_backward(dkr.data(), dw.data() + D, gk.data(), kr.data(), krs.data(), kw, N * KVH,
                          D);
    rb(dqr), rb(dkr);
    cpu::qkv_split_backward(dqkv.data(), dqr.data(), dkr.data(), dvi.data(), N, H, KVH, D);
    // fused
    std::vector<float> fq(HD), fk(KD), fv(KD), fqrs(N * H), fkrs(N * KVH), fdqkv(N * R, 7.0f),
        fdw(2 * D, 0.5f);
    cpu::qk_norm_rope_forward(fq.data(), fk.data(), fv.data(), fqrs.data(), fkrs.data(), qkv.data(),
                              qw, kw, cs.data(), sn.data(), B, T, H, KVH, D, 1e-6, rnd, false, doc);
    cpu::qk_norm_rope_backward(fdqkv.data(), fdw.data(), fdw.data() + D, dq.data(), dk.data(),
                               dvi.data(), qkv.data(), fqrs.data(), fkrs.data(), qw, kw, cs.data(),
                               sn.data(), B, T, H, KVH, D, rnd, false, doc);
    const std::string what = rnd ? "rounded" : "fp32";
    EXPECT_EQ(fq, q) << what;
    EXPECT_EQ(fk, k) << what;
    EXPECT_EQ(fv, v) << what;
    EXPECT_EQ(fqrs, qrs) << what;
    EXPECT_EQ(fkrs, krs) << what;
    EXPECT_EQ(fdqkv, dqkv) << what;            // overwritten, every slot
    EXPECT_LT(rel_l2(fdw, dw), 1e-6) << what;  // added into
    if (!rnd) continue;
    for (float x : fdqkv) ASSERT_EQ(x, round_bf16(x));
    // every activation in bf16 storage (bf16 runs): the same bits on the same bf16 inputs
    std::vector<float> qkvr = qkv, dqr2 = dq, dkr2 = dk, q2(HD), k2(KD), v2(KD), qrs2(N * H),
                       krs2(N * KVH), dqkv2(N * R), dw2(2 * D, 0.5f), qrs3 = qrs2, krs3 = krs2,
                       dw3 = dw2;
    rb(qkvr), rb(dqr2), rb(dkr2);
    cpu::qk_norm_rope_forward(q2.data(), k2.data(), v2.data(), qrs2.data(), krs2.data(),
                              qkvr.data(), qw, kw, cs.data(), sn.data(), B, T, H, KVH, D, 1e-6,
                              true, false, doc);
    cpu::qk_norm_rope_backward(dqkv2.data(), dw2.data(), dw2.data() + D, dqr2.data(), dkr2.data(),
                               dvi.data(), qkvr.data(), qrs2.data(), krs2.data(), qw, kw, cs.data(),
                               sn.data(), B, T, H, KVH, D, true, false, doc);
    const auto to16 = [](const std::vector<float>& x) {
      std::vector<uint16_t> h(x.size());
      for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_bf16(x[i]);
      return h;
    };
    const auto f = [](std::vector<uint16_t>& h) { return reinterpret_cast<float*>(h.data()); };
    std::vector<uint16_t> qkv16 = to16(qkvr), dq16 = to16(dqr2), dk16 = to16(dkr2),
                          dv16 = to16(dvi), q16(HD, 1), k16(KD, 1), v16(KD, 1), dqkv16(N * R, 1);
    cpu::qk_norm_rope_forward(f(q16), f(k16), f(v16), qrs3.data(), krs3.data(), f(qkv16), qw, kw,
                              cs.data(), sn.data(), B, T, H, KVH, D, 1e-6, true, true, doc);
    cpu::qk_norm_rope_backward(f(dqkv16), dw3.data(), dw3.data() + D, f(dq16), f(dk16), f(dv16),
                               f(qkv16), qrs3.data(), krs3.data(), qw, kw, cs.data(), sn.data(), B,
                               T, H, KVH, D, true, true, doc);
    EXPECT_EQ(q16, to16(q2));
    EXPECT_EQ(k16, to16(k2));
    EXPECT_EQ(v16, to16(v2));
    EXPECT_EQ(qrs3, qrs2);
    EXPECT_EQ(krs3, krs2);
    EXPECT_EQ(dw3, dw2);
    EXPECT_EQ(dqkv16, to16(dqkv2));
  }
}
INSTANTIATE_TEST_SUITE_P(
    Shapes, QkNormRope,
    ::testing::Values(std::tuple{1, 1, 1, 1, 2, 0}, std::tuple{2, 5, 4, 2, 8, 0},
                      std::tuple{1, 7, 6, 3, 6, 0}, std::tuple{3, 3, 2, 2, 10, 0},
                      std::tuple{2, 40, 16, 8, 128, 0}, std::tuple{4, 7, 6, 3, 6, 3},
                      std::tuple{2, 40, 16, 8, 128, 9}));

// QK-norm + RoPE inside attention (attention_qkn_*): the outputs of qk_norm_rope_* then
// attention_*, bit for bit, in fp32, the bf16 kind and bf16 storage, for any thread count; the
// norm weights' gradients summed in another order.
class AttentionQkn : public ::testing::TestWithParam<std::tuple<int, int, int, int, int, int>> {};
TEST_P(AttentionQkn, EqualsQkNormRopeThenAttention) {
  if (!cpu::own_kernels()) GTEST_SKIP() << "no kernel set here (TQ_CPU=generic): no fused op";
  const auto [B, T, H, KVH, D, every] = GetParam();  // (every as in Rope)
  const int64_t N = B * T, HD = N * H * D, KD = N * KVH * D, R = (H + 2 * KVH) * D;
  const std::vector<int32_t> docs = every ? random_docs(B, T, every, 6) : std::vector<int32_t>();
  const int32_t* doc = doc_arg(docs);
  std::vector<float> cs, sn;
  rope_tables(cs, sn, T, D, 1e4);
  const std::vector<float> w = to_f(randn(2 * D, 2, 0.3));
  const float *qw = w.data(), *kw = w.data() + D;
  for (const bool bf : {false, true})
    for (const bool h16 : {false, true}) {
      if (h16 && !bf) continue;
      std::vector<float> qkv = to_f(randn(N * R, 1)), G = to_f(randn(HD, 3));
      if (bf) cpu::round_bf16_inplace(qkv.data(), N * R), cpu::round_bf16_inplace(G.data(), HD);
      if (h16) {  // bf16 bits in the first half of each array
        for (auto* x : {&qkv, &G})
          for (size_t i = 0; i < x->size(); ++i) {
            const uint16_t h = f32_to_bf16((*x)[i]);
            std::memcpy(reinterpret_cast<uint16_t*>(x->data()) + i, &h, 2);
          }
      }
      const int64_t es = h16 ? 2 : 4;  // bytes per activation element
      // (P starts at a 64-byte boundary of the address: compared from the same one)
      const int64_t nst = cpu::attention_stats(B, T, H, KVH, D, bf);
      const auto al = [](std::vector<float>& x) {
        return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(x.data()) + 63) / 64 * 64);
      };
      const std::string what = std::string(bf ? (h16 ? "bf16 storage" : "bf16") : "fp32");
      // composed
      std::vector<float> q(HD), k(KD), v(KD), qrs(N * H), krs(N * KVH), out(HD), st(nst + 16),
          dq(HD), dk(KD), dv(KD), dqkv(N * R), dw(2 * D, 0.5f);
      cpu::qk_norm_rope_forward(q.data(), k.data(), v.data(), qrs.data(), krs.data(), qkv.data(),
                                qw, kw, cs.data(), sn.data(), B, T, H, KVH, D, 1e-6, bf, h16, doc);
      if (bf) {
        cpu::attention_forward_bf16(out.data(), al(st), q.data(), k.data(), v.data(), B, T, H, KVH,
                                    D, h16, doc);
        cpu::attention_backward_bf16(dq.data(), dk.data(), dv.data(), G.data(), out.data(), al(st),
                                     q.data(), k.data(), v.data(), B, T, H, KVH, D, h16, doc);
      } else {
        cpu::attention_forward(out.data(), al(st), q.data(), k.data(), v.data(), B, T, H, KVH, D,
                               doc);
        cpu::attention_backward(dq.data(), dk.data(), dv.data(), G.data(), out.data(), al(st),
                                q.data(), k.data(), v.data(), B, T, H, KVH, D, doc);
      }
      cpu::qk_norm_rope_backward(dqkv.data(), dw.data(), dw.data() + D, dq.data(), dk.data(),
                                 dv.data(), qkv.data(), qrs.data(), krs.data(), qw, kw, cs.data(),
                                 sn.data(), B, T, H, KVH, D, bf, h16, doc);
      std::vector<float> fdw1;
      for (const int threads : {3, 1}) {
        omp_set_num_threads(threads);
        std::vector<float> fqrs(N * H), fkrs(N * KVH), fout(HD, 7.0f), fst(nst + 16),
            fdqkv(N * R, 7.0f), fdw(2 * D, 0.5f);
        cpu::attention_qkn_forward(fout.data(), al(fst), fqrs.data(), fkrs.data(), qkv.data(), qw,
                                   kw, cs.data(), sn.data(), B, T, H, KVH, D, 1e-6, bf, h16, doc);
        cpu::attention_qkn_backward(fdqkv.data(), fdw.data(), fdw.data() + D, G.data(), fout.data(),
                                    al(fst), qkv.data(), fqrs.data(), fkrs.data(), qw, kw,
                                    cs.data(), sn.data(), B, T, H, KVH, D, bf, h16, doc);
        const std::string at = what + ", " + std::to_string(threads) + " threads";
        EXPECT_EQ(0, std::memcmp(fout.data(), out.data(), size_t(HD * es))) << at << ": out";
        EXPECT_EQ(0, std::memcmp(al(fst), al(st), size_t(nst * 4))) << at << ": stats";
        EXPECT_EQ(fqrs, qrs) << at;
        EXPECT_EQ(fkrs, krs) << at;
        EXPECT_EQ(0, std::memcmp(fdqkv.data(), dqkv.data(), size_t(N * R * es))) << at << ": dqkv";
        EXPECT_LT(rel_l2(fdw, dw), 1e-6) << at;  // added into
        if (fdw1.empty())
          fdw1 = fdw;
        else
          EXPECT_EQ(fdw, fdw1) << at << ": the norm weights' gradients by the thread count";
      }
      omp_set_num_threads(2);
    }
}
INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionQkn,
    ::testing::Values(std::tuple{1, 1, 1, 1, 2, 0}, std::tuple{2, 5, 4, 2, 8, 0},
                      std::tuple{1, 7, 6, 3, 6, 0}, std::tuple{3, 3, 2, 2, 10, 0},
                      std::tuple{2, 40, 16, 8, 128, 0}, std::tuple{1, 130, 4, 2, 16, 0},
                      std::tuple{1, 200, 2, 1, 128, 0}, std::tuple{4, 7, 6, 3, 6, 3},
                      std::tuple{2, 130, 4, 2, 16, 30}, std::tuple{2, 200, 2, 1, 128, 40}));

TEST(MatmulBf16w, StoresOutAndDxRoundedToBf16) {
  if (!cpu::own_kernels()) GTEST_SKIP() << "no AVX2/AVX-512 kernels: the model rounds itself";
  for (const int64_t N : {32, 200}) {  // the skinny path and the general one
    const int64_t IC = 64, OC = 48;
    std::vector<float> x = to_f(randn(int(N * IC), 11)), g = to_f(randn(int(N * OC), 12)),
                       wf = to_f(randn(int(OC * IC), 13));
    cpu::round_bf16_inplace(x.data(), int64_t(x.size()));
    cpu::round_bf16_inplace(g.data(), int64_t(g.size()));
    std::vector<uint16_t> w(wf.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(wf[i]);
    std::vector<float> out(size_t(N * OC)), dx(size_t(N * IC)), dx2(dx.size()), dW(wf.size());
    cpu::matmul_forward_bf16w({out.data()}, {x.data()}, w.data(), N, IC, OC);
    cpu::matmul_backward_bf16w({dx.data()}, dW.data(), {g.data()}, {x.data()}, w.data(), N, IC, OC);
    cpu::matmul_backward_sgd_bf16w({dx2.data()}, w.data(), {g.data()}, {x.data()}, N, IC, OC, 0.0f);
    // the same with every activation in bf16 storage: the same bits, and the same dW
    std::vector<uint16_t> x16(x.size()), g16(g.size()), out16(out.size()), dx16(dx.size()),
        dx16s(dx.size());
    for (size_t i = 0; i < x.size(); ++i) x16[i] = f32_to_bf16(x[i]);
    for (size_t i = 0; i < g.size(); ++i) g16[i] = f32_to_bf16(g[i]);
    std::vector<float> dW16(wf.size());
    cpu::matmul_forward_bf16w({out16.data(), true}, {x16.data(), true}, w.data(), N, IC, OC);
    cpu::matmul_backward_bf16w({dx16.data(), true}, dW16.data(), {g16.data(), true},
                               {x16.data(), true}, w.data(), N, IC, OC);
    cpu::matmul_backward_sgd_bf16w({dx16s.data(), true}, w.data(), {g16.data(), true},
                                   {x16.data(), true}, N, IC, OC, 0.0f);
    for (size_t i = 0; i < out.size(); ++i)
      ASSERT_EQ(out16[i], f32_to_bf16(out[i])) << "bf16 out, N=" << N << " at " << i;
    for (size_t i = 0; i < dx.size(); ++i) {
      ASSERT_EQ(dx16[i], f32_to_bf16(dx[i])) << "bf16 dx, N=" << N << " at " << i;
      ASSERT_EQ(dx16s[i], dx16[i]) << "bf16 dx of the fused step, N=" << N << " at " << i;
    }
    ASSERT_EQ(dW16, dW) << "dW from bf16 storage, N=" << N;
    std::vector<float> want_out(out.size()), want_dx(dx.size());
    cpu::gemm_bf16(N, OC, IC, {x.data(), false, IC, 1}, {w.data(), true, IC, 1}, want_out.data(),
                   OC, false);
    cpu::gemm_bf16(N, IC, OC, {g.data(), false, OC, 1}, {w.data(), true, 1, IC}, want_dx.data(), IC,
                   false);
    for (size_t i = 0; i < out.size(); ++i)
      ASSERT_EQ(out[i], round_bf16(want_out[i])) << "out, N=" << N << " at " << i;
    for (size_t i = 0; i < dx.size(); ++i) {
      ASSERT_EQ(dx[i], round_bf16(want_dx[i])) << "dx, N=" << N << " at " << i;
      ASSERT_EQ(dx2[i], dx[i]) << "dx of the fused step, N=" << N << " at " << i;
    }
  }
}

// The weight gradient stored into bf16 (a gradient's first contribution): the bits of
// matmul_backward_bf16w into a zeroed fp32 buffer, then bf16_accumulate into a zeroed bf16
// gradient; dx the same. Few tokens (the skinny dx), a W2 step's, and more than one packed
// block of slots holds (over 4096 tokens: each block of the gradient finished over the k
// blocks); activations in fp32 and bf16 storage; 1 and 3 threads.
TEST(MatmulBf16w, StoredGradientIsTheAccumulatedOne) {
  if (!cpu::own_kernels()) GTEST_SKIP() << "no AVX2/AVX-512 kernels: the model accumulates itself";
  for (const int64_t N : {32, 2048, 4500})
    for (const bool h16 : {false, true}) {
      const int64_t IC = N > 2048 ? 40 : 72, OC = N > 2048 ? 30 : 100;
      std::vector<float> x = to_f(randn(size_t(N * IC), 31)), g = to_f(randn(size_t(N * OC), 32)),
                         wf = to_f(randn(size_t(OC * IC), 33));
      cpu::round_bf16_inplace(x.data(), int64_t(x.size()));
      cpu::round_bf16_inplace(g.data(), int64_t(g.size()));
      std::vector<uint16_t> w(wf.size()), x16(x.size()), g16(g.size());
      for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(wf[i]);
      for (size_t i = 0; i < x.size(); ++i) x16[i] = f32_to_bf16(x[i]);
      for (size_t i = 0; i < g.size(); ++i) g16[i] = f32_to_bf16(g[i]);
      const Act xa = h16 ? Act{x16.data(), true} : Act{x.data()},
                ga = h16 ? Act{g16.data(), true} : Act{g.data()};
      const size_t dxb = size_t(N * IC) * (h16 ? 2 : 4);
      std::vector<char> dx1(dxb), dx2(dxb);
      std::vector<float> dW(wf.size(), 0.0f);
      std::vector<uint16_t> want(wf.size(), 0), one;
      cpu::matmul_backward_bf16w({dx1.data(), h16}, dW.data(), ga, xa, w.data(), N, IC, OC);
      cpu_ops().bf16_accumulate(want.data(), dW.data(), int64_t(dW.size()));
      for (int threads : {1, 3}) {
        omp_set_num_threads(threads);
        std::vector<uint16_t> got(wf.size(), 0x7fc1);  // overwritten, whatever it held
        cpu::matmul_backward_bf16g({dx2.data(), h16}, got.data(), ga, xa, w.data(), N, IC, OC);
        ASSERT_EQ(got, want) << "N=" << N << " h16 " << h16 << ", " << threads << " threads";
        ASSERT_EQ(dx2, dx1) << "dx, N=" << N << " h16 " << h16 << ", " << threads << " threads";
      }
      omp_set_num_threads(cpu::threads());
    }
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(round_bf16(1.0f + 0x1p-8f), 1.0f);                // tie -> even
  EXPECT_EQ(round_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);  // tie -> even (up)
  EXPECT_EQ(round_bf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isnan(round_bf16(NAN)));
  // a NaN whose payload lies below bf16's bits stays NaN (quiet), sign kept
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x7f800001u)), 0x7fc0);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0xff800001u)), 0xffc0);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x7f7fffffu)), 0x7f80);  // largest float -> inf
  EXPECT_EQ(round_bf16(INFINITY), INFINITY);
  std::vector<float> x = {0.1f, -3.3f, 1e-30f};
  cpu::round_bf16_inplace(x.data(), 3);
  for (float f : x) EXPECT_EQ(f, round_bf16(f));
}

}  // namespace
}  // namespace tq

// lane_sum's order, written out: lane i % 16 summed in index order, then the lanes pairwise
// (8 apart, 4, 2, 1); the vectorized build must give exactly these bits.
TEST(LaneSum, SumsByLanesThenPairwise) {
  std::vector<float> x(200);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::ldexp(std::sin(float(i) * 1.7f), int(i % 23) - 11);  // magnitudes 2^-11..2^11
  for (int64_t n = 0; n <= 200; ++n) {
    float acc[16] = {};
    for (int64_t i = 0; i < n; ++i) acc[i % 16] += x[size_t(i)];
    for (int w = 8; w > 0; w /= 2)
      for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
    EXPECT_EQ(tq::cpu::lane_sum_for_tests(x.data(), n), acc[0]) << n;
  }
}

// The softmaxes' row maximum by lanes: the serial std::max loop's value at every length, NaNs
// passed over as std::max passes them (at any place), infinities kept; of +0 and -0 (equal)
// either.
TEST(LaneMax, IsTheSerialMaximum) {
  std::vector<float> x(200);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 1.7f) * float(i % 7);
  const auto serial = [&](int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, x[size_t(i)]);
    return m;
  };
  for (int pass = 0; pass < 4; ++pass) {
    if (pass == 1) x[37] = NAN, x[0] = NAN, x[150] = NAN;
    if (pass == 2) x[77] = INFINITY;
    if (pass == 3)  // all at most zero, the largest both zeros
      for (size_t i = 0; i < x.size(); ++i) x[i] = i % 5 == 0 ? (i % 2 ? -0.0f : 0.0f) : -1.0f;
    for (int64_t n = 0; n <= 200; ++n) {
      const float want = serial(n), got = tq::cpu::lane_max_for_tests(x.data(), n);
      ASSERT_FALSE(std::isnan(got)) << "pass " << pass << " n " << n;
      ASSERT_EQ(got, want) << "pass " << pass << " n " << n;
    }
  }
}

// The vectorizable exp of the softmaxes and SwiGLU: within 2 ulp of std::exp over the
// normal range, exact limits outside it.
TEST(Exp, WithinTwoUlpOfStdExp) {
  const auto check = [](float x) {  // a normal result within 2 ulp of std::exp
    const float got = tq::cpu::exp_for_tests(x), want = std::exp(x);
    const int ulp = std::abs(std::bit_cast<int32_t>(got) - std::bit_cast<int32_t>(want));
    ASSERT_TRUE(std::isnormal(got) && ulp <= 2) << "x=" << x << " got " << got << " want " << want;
  };
  for (float x = -87.0f; x < 88.5f; x += 0.000731f) ASSERT_NO_FATAL_FAILURE(check(x));
  // every float at both ends of the range, where 2^n is added into the exponent at its limits
  for (const auto& [lo, hi] : {std::pair{-87.33654f, -87.0f}, std::pair{88.4f, 88.72283f}})
    for (float x = lo; x <= hi; x = std::nextafter(x, INFINITY)) ASSERT_NO_FATAL_FAILURE(check(x));
  EXPECT_EQ(tq::cpu::exp_for_tests(std::nextafter(-87.33654f, -INFINITY)), 0.0f);
  EXPECT_EQ(tq::cpu::exp_for_tests(std::nextafter(88.72283f, INFINITY)), INFINITY);
  EXPECT_EQ(tq::cpu::exp_for_tests(0.0f), 1.0f);
  EXPECT_EQ(tq::cpu::exp_for_tests(-100.0f), 0.0f);
  EXPECT_EQ(tq::cpu::exp_for_tests(-INFINITY), 0.0f);
  EXPECT_EQ(tq::cpu::exp_for_tests(100.0f), INFINITY);
  EXPECT_TRUE(std::isnan(tq::cpu::exp_for_tests(NAN)));
}

// The AVX-512 QK-norm + RoPE rows (attention_qkn_* at D = 128) against the generic row code,
// bit for bit: rows, rstd, gradients and the norm weight's gradient, in both storages, rounded
// or not, for row counts around its batches of 8, with rows at the edges of the range: zero,
// subnormal, overflowing squares, an infinity, a NaN (a row's one NaN, so one payload).
TEST(QkRows, Avx512RowsEqualTheGenericRows) {
  using tq::f32_to_bf16;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t D = 128, R = 3 * D, N = 41;
  std::vector<float> w(D), cs(size_t(N) * 64), sn(size_t(N) * 64), src(size_t(N) * D),
      g(size_t(N) * D);
  for (auto& v : w) v = 1.0f + 0.2f * nd(rng);
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t e = 0; e < 64; ++e) {
      const float a = float(t) * std::pow(1e4f, -float(e) / 64.0f);
      cs[size_t(t * 64 + e)] = std::cos(a), sn[size_t(t * 64 + e)] = std::sin(a);
    }
    const int kind = int(t % 8);  // 0-2 plain rows of three scales, then the edges
    const float scale = kind == 0   ? 1.0f
                        : kind == 1 ? 1e-3f
                        : kind == 2 ? 40.0f
                        : kind == 3 ? 0.0f
                        : kind == 4 ? 1e-42f
                        : kind == 5 ? 3e30f
                                    : 1.0f;
    for (int64_t e = 0; e < D; ++e) {
      src[size_t(t * D + e)] = nd(rng) * scale;
      g[size_t(t * D + e)] = nd(rng) * (t % 5 == 4 ? 1e-40f : t % 5 == 3 ? 1e25f : 1.0f);
    }
    if (kind == 6) src[size_t(t * D + 5)] = INFINITY;
    if (kind == 7) src[size_t(t * D + 70)] = NAN;
    if (t == 13) g[size_t(t * D + 3)] = NAN;
  }
  bool ran = false;
  for (const bool h16 : {false, true})
    for (const bool rnd : {false, true}) {
      if (h16 && !rnd) continue;  // bf16 storage: bf16 runs only
      // the projection's rows, R apart (bf16 bits where h16), and the outputs of both ways
      const size_t es = h16 ? 2 : 4;
      std::vector<char> in(size_t(N * R) * es), o[2], d[2];
      for (int64_t t = 0; t < N; ++t)
        for (int64_t e = 0; e < D; ++e) {
          const float v = src[size_t(t * D + e)];
          if (h16) {
            const uint16_t b = f32_to_bf16(v);
            std::memcpy(in.data() + size_t(t * R + e) * 2, &b, 2);
          } else {
            const float f = rnd ? tq::round_bf16(v) : v;
            std::memcpy(in.data() + size_t(t * R + e) * 4, &f, 4);
          }
        }
      for (const int64_t n : {int64_t(1), int64_t(7), int64_t(8), int64_t(9), N}) {
        std::vector<float> rs[2], dw[2];
        for (int fast = 0; fast < 2; ++fast) {
          o[fast].assign(size_t(n * D) * es, 0), d[fast].assign(size_t(n * R) * es, 0);
          rs[fast].assign(size_t(n), 0.0f), dw[fast].assign(size_t(D), 0.25f);
          if (!tq::cpu::qk_rows_for_tests(fast, h16, o[fast].data(), in.data(), R, rs[fast].data(),
                                          true, w.data(), cs.data(), sn.data(), n, rnd))
            GTEST_SKIP() << "no AVX-512 row code in this build (not built for AVX-512 BW and VL)";
          // the backward recomputes the rows from the saved rstd
          std::vector<char> again(size_t(n * D) * es);
          tq::cpu::qk_rows_for_tests(fast, h16, again.data(), in.data(), R, rs[fast].data(), false,
                                     w.data(), cs.data(), sn.data(), n, rnd);
          EXPECT_TRUE(again == o[fast]) << "rows again from the saved rstd";
          tq::cpu::qk_grads_for_tests(fast, h16, d[fast].data(), in.data(), R, g.data(),
                                      rs[fast].data(), w.data(), cs.data(), sn.data(), n, rnd,
                                      dw[fast].data());
        }
        ran = true;
        const std::string at = std::string(h16   ? "bf16 storage"
                                           : rnd ? "fp32, rounded"
                                                 : "fp32") +
                               ", " + std::to_string(n) + " rows";
        const auto differ = [es](const std::vector<char>& a, const std::vector<char>& b) {
          int64_t k = 0;  // elements whose bits differ
          for (size_t i = 0; i < a.size(); i += es) k += std::memcmp(&a[i], &b[i], es) != 0;
          return k;
        };
        EXPECT_EQ(0, std::memcmp(rs[0].data(), rs[1].data(), size_t(n) * 4)) << at << ": rstd";
        EXPECT_EQ(0, differ(o[0], o[1])) << at << ": rows";
        EXPECT_EQ(0, differ(d[0], d[1])) << at << ": gradients";
        EXPECT_EQ(0, std::memcmp(dw[0].data(), dw[1].data(), size_t(D) * 4)) << at << ": dw";
      }
    }
  EXPECT_TRUE(ran);
}
