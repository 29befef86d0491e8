// torch.manual_seed / normal_ / uniform_ semantics. Golden values were printed by
// Debian's torch 1.13 on the CPU (see the comments); the full init is compared with
// PyTorch in tests/torch/test_parity.py.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/init.h"

namespace tq {
namespace {

// The block generator against std::mt19937: single draws, fills and discards of every
// length around the 624-word blocks, several seeds.
TEST(Mt19937, MatchesStdMt19937) {
  for (uint32_t seed : {0u, 1u, 1234u, 0xffffffffu}) {
    Mt19937 fast(seed);
    std::mt19937 ref(seed);
    std::vector<uint32_t> buf(3000);
    std::mt19937 lengths(seed + 7);
    for (int round = 0; round < 400; ++round) {
      const size_t n = lengths() % (round % 3 == 2 ? 3000 : 700);
      if (round % 3 == 0) {
        fast.fill(buf.data(), n);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(buf[i], ref()) << seed << " fill " << round;
      } else if (round % 3 == 1) {
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(fast.next(), ref()) << seed << " next " << round;
      } else {
        fast.discard(n);
        ref.discard(n);
        ASSERT_EQ(fast.next(), ref()) << seed << " discard " << round;
      }
    }
    fast.discard(10'000'019);
    ref.discard(10'000'019);
    EXPECT_EQ(fast.next(), ref());
  }
}

TEST(TorchRng, UniformMatchesTorch) {
  // torch.manual_seed(0); torch.empty(32).normal_(); torch.empty(20).normal_(); then:
  TorchRng r(0);
  r.skip(32 + 20 + 16);  // 20 is not a multiple of 16: torch draws 16 more for the tail
  const float expect[] = {0.8101882934570312f, 0.9800970554351807f, 0.1146882176399231f,
                          0.3167651295661926f, 0.6965049505233765f};
  for (float e : expect) EXPECT_EQ(r.uniform(), e);
}

TEST(TorchRng, NormalMatchesTorch) {
  // fp32 libm vs torch's vectorized Cephes-style routines: a few 1e-8 apart (spec §9)
  // torch.manual_seed(0); a = torch.empty(32).normal_(0, 0.02); b = torch.empty(20).normal_(0,
  // 0.02)
  TorchRng r(0);
  std::vector<float> a(32), b(20);
  r.normal(a.data(), 32, 0.02f);
  r.normal(b.data(), 20, 0.02f);
  const std::vector<std::pair<int, double>> ea = {
      {0, -0.022516796365380287}, {1, -0.023047203198075294},  {7, -0.0423043854534626},
      {8, 0.006445498205721378},  {15, -0.004945563152432442}, {16, -0.027053074911236763},
      {31, -0.01687353476881981}};
  for (auto [i, v] : ea) EXPECT_NEAR(a[i], v, 5e-8) << i;
  const std::vector<std::pair<int, double>> eb = {{0, -0.012271661311388016},
                                                  {3, 0.004968294873833656},
                                                  {4, -0.004606709349900484},
                                                  {19, -0.009898507036268711}};
  for (auto [i, v] : eb) EXPECT_NEAR(b[i], v, 5e-8) << i;
  // torch.manual_seed(1234); torch.empty(16).normal_(0, 1)[5]
  TorchRng r2(1234);
  std::vector<float> c(16);
  r2.normal(c.data(), 16, 1.0f);
  EXPECT_NEAR(c[5], 0.668373703956604, 1e-7);
}

TEST(Init, FollowsTorchTitanLayoutAndDistributions) {
  const Config& c = preset("debugmodel");
  const ParamLayout p = make_layout(c);
  std::vector<float> w(p.total);
  init_params(w.data(), c, p, 0);
  for (const ParamView& v : p.params) {
    double s = 0, ss = 0;
    for (size_t i = 0; i < v.numel; ++i)
      s += w[v.offset + i], ss += double(w[v.offset + i]) * w[v.offset + i];
    const double mean = s / v.numel, sd = std::sqrt(ss / v.numel - mean * mean);
    if (v.shape.size() == 1) {
      EXPECT_EQ(mean, 1.0) << v.name;
      EXPECT_EQ(sd, 0.0) << v.name;
    } else {
      EXPECT_NEAR(mean, 0.0, 1e-3) << v.name;
      EXPECT_NEAR(sd, 0.02, 2e-4) << v.name;
    }
  }
  // same seed, same weights; another seed, other weights
  std::vector<float> w2(p.total), w3(p.total);
  init_params(w2.data(), c, p, 0);
  init_params(w3.data(), c, p, 1);
  EXPECT_EQ(w, w2);
  EXPECT_NE(w[p.layers[0].wo], w3[p.layers[0].wo]);
}

// A tensor longer than kInitPiece is drawn by pieces: the values of one normal_ call over it
// (here 4,200,100 values, not a multiple of 16), and the stream after it the same.
TEST(Init, DrawsLargeTensorsByPiecesAsOneCall) {
  //          name   V      C    L  H  KVH D  F   ctx theta tied   eps
  const Config c{"big", 42001, 100, 1, 2, 1, 8, 16, 64, 1e4, false, 1e-6f};
  const ParamLayout p = make_layout(c);
  const size_t n = size_t(c.V * c.C);
  ASSERT_GT(n, kInitPiece + 16);
  ASSERT_NE(n % 16, 0u);
  std::vector<float> w(p.total);
  init_params(w.data(), c, p, 7);
  TorchRng r(7);
  const uint64_t per_layer = c.qkv_rows() * c.C + c.C * c.H * c.D + 3 * c.F * c.C;
  r.skip(n + c.L * per_layer + n);
  std::vector<float> emb(n), q(size_t(c.H * c.D * c.C));
  r.normal(emb.data(), n, 0.02f);
  r.normal(q.data(), q.size(), 0.02f);  // layer 0's wq: its first head leads the fused rows
  EXPECT_TRUE(std::equal(emb.begin(), emb.end(), w.begin() + p.tok_emb));
  EXPECT_TRUE(std::equal(q.begin(), q.begin() + c.D * c.C, w.begin() + p.layers[0].wqkv));
}

}  // namespace
}  // namespace tq
