// The training layer's pieces: TorchTitan's schedule, the batch windows, the optimizers' flat
// loops. The whole loop against PyTorch is tests/torch/test_train_text.py.
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "core/common.h"
#include "data/shard.h"
#include "model/ops.h"
#include "testing.h"
#include "train/data.h"
#include "train/optimizer.h"
#include "train/schedule.h"

namespace tq::train {
namespace {

TEST(Schedule, TorchTitansWarmupStableDecay) {
  // qwen3_debugmodel: 10 steps, warmup 2, decay ratio 0.8 -> decay 8, stable 10 + 1 - 2 - 8 = 1
  const Schedule s = Schedule::make(10, 2, 0.8, DecayType::linear, 0.0);
  EXPECT_EQ(s.warmup, 2);
  EXPECT_EQ(s.decay, 8);
  EXPECT_EQ(s.stable, 1);
  const double want[10] = {0.5,         1.0,         1.0,         1 - 1 / 8.0, 1 - 2 / 8.0,
                           1 - 3 / 8.0, 1 - 4 / 8.0, 1 - 5 / 8.0, 1 - 6 / 8.0, 1 - 7 / 8.0};
  for (int i = 0; i < 10; ++i) EXPECT_DOUBLE_EQ(s.factor(i), want[i]) << i;
  // cosine to a floor; sqrt
  const Schedule c = Schedule::make(10, 0, 0.5, DecayType::cosine, 0.1);
  EXPECT_EQ(c.decay, 5);
  EXPECT_DOUBLE_EQ(c.factor(5), 1.0);  // stable: 10 + 1 - 0 - 5 = 6 steps
  EXPECT_DOUBLE_EQ(c.factor(6), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 1 / 5.0)));
  const Schedule q = Schedule::make(4, 1, std::nullopt, DecayType::sqrt, 0.0);
  EXPECT_EQ(q.decay, 3);  // without a ratio: steps - warmup
  EXPECT_DOUBLE_EQ(q.factor(3), 1 - std::sqrt(2 / 3.0));
  // warmup past the steps is capped; a decay that does not fit is shortened; round() halves
  // to even as Python's
  EXPECT_EQ(Schedule::make(3, 5, 0.8, DecayType::linear, 0).warmup, 3);
  EXPECT_EQ(Schedule::make(10, 5, 0.8, DecayType::linear, 0).decay, 5);
  EXPECT_EQ(Schedule::make(5, 0, 0.5, DecayType::linear, 0).decay, 2);  // round(2.5) = 2
  EXPECT_EQ(Schedule::make(7, 0, 0.5, DecayType::linear, 0).decay, 4);  // round(3.5) = 4
}

// A split of ids 0, 1, 2, ... in two shards.
struct Stream {
  std::string dir = test::tmp_path("stream");
  Stream(uint32_t n, uint32_t first_shard) {
    mkdir(dir.c_str(), 0700);
    std::vector<uint32_t> ids(n);
    std::iota(ids.begin(), ids.end(), 0u);
    data::write_shard(dir + "/train_000000.bin", ids.data(), first_shard);
    data::write_shard(dir + "/train_000001.bin", ids.data() + first_shard, n - first_shard);
  }
  ~Stream() {
    std::remove((dir + "/train_000000.bin").c_str());
    std::remove((dir + "/train_000001.bin").c_str());
    rmdir(dir.c_str());
  }
};

TEST(BatchLoader, LlmcWindowsAcrossShardsAndEpochs) {
  Stream st(100, 37);
  TokenStream s(st.dir, "train", 1000);
  EXPECT_EQ(s.size(), 100u);
  BatchLoader l(s, 2, 8, DataOrder::sequential, 0);
  EXPECT_EQ(l.windows(), 6u);  // floor(99 / 16)
  Batch b;
  for (uint64_t k = 0; k < 8; ++k) {
    l.next(b);
    const int32_t w = int32_t(k % 6) * 16;  // wraps into a new epoch after 6
    for (int r = 0; r < 2; ++r)
      for (int t = 0; t < 8; ++t) {
        EXPECT_EQ(b.tokens[size_t(r * 8 + t)], w + r * 8 + t);
        EXPECT_EQ(b.targets[size_t(r * 8 + t)], w + r * 8 + t + 1);
      }
  }
  EXPECT_EQ(l.epoch(), 1u);
  EXPECT_EQ(l.position(), 2u);
  EXPECT_THROW(BatchLoader(s, 10, 10, DataOrder::sequential, 0), Error);  // 101 > 100 ids
  EXPECT_THROW(TokenStream(st.dir, "train", 50), Error);                  // an id past the vocab
}

TEST(BatchLoader, ShuffledIsAPermutationPerEpochFixedBySeed) {
  Stream st(1000, 500);
  TokenStream s(st.dir, "train", 1000);
  BatchLoader a(s, 1, 9, DataOrder::shuffled, 7), b(s, 1, 9, DataOrder::shuffled, 7),
      c(s, 1, 9, DataOrder::shuffled, 8);
  const uint64_t n = a.windows();
  EXPECT_EQ(n, 111u);
  std::vector<uint64_t> e0, e1, other;
  for (uint64_t i = 0; i < n; ++i) {
    e0.push_back(a.window_at(0, i));
    e1.push_back(a.window_at(1, i));
    other.push_back(c.window_at(0, i));
    EXPECT_EQ(b.window_at(0, i), e0.back());
  }
  EXPECT_EQ(std::set<uint64_t>(e0.begin(), e0.end()).size(), n);
  EXPECT_EQ(*std::max_element(e0.begin(), e0.end()), n - 1);
  EXPECT_NE(e0, e1);     // a new order each epoch
  EXPECT_NE(e0, other);  // and each seed
}

TEST(Optimizer, AdamWIsTorchsFormula) {
  const size_t n = 1000;
  std::vector<float> p(n), m(n, 0.f), v(n, 0.f), g(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = std::sin(float(i)) * 0.1f;
    g[i] = std::cos(float(i) * 0.7f) * (i % 7 ? 1e-3f : 1.0f);
  }
  std::vector<double> pd(p.begin(), p.end()), md(n, 0), vd(n, 0);
  const AdamWConfig c{0.9, 0.95, 1e-8, 0.1};
  for (int step = 1; step <= 3; ++step) {
    const double lr = 1e-3 * step;
    adamw_step(p.data(), m.data(), v.data(), g.data(), n, lr, c, step);
    for (size_t i = 0; i < n; ++i) {  // in double: the textbook AdamW
      pd[i] *= 1 - lr * c.weight_decay;
      md[i] = c.beta1 * md[i] + (1 - c.beta1) * g[i];
      vd[i] = c.beta2 * vd[i] + (1 - c.beta2) * double(g[i]) * g[i];
      const double mh = md[i] / (1 - std::pow(c.beta1, step));
      const double vh = vd[i] / (1 - std::pow(c.beta2, step));
      pd[i] -= lr * mh / (std::sqrt(vh) + c.eps);
    }
  }
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], pd[i], 1e-6) << i;
}

TEST(Optimizer, NormIsTheSameAtEveryThreadCount) {
  std::vector<float> g(300001);
  for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(float(i) * 0.37f);
  double ref = 0;
  for (float x : g) ref += double(x) * x;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = global_norm(g.data(), g.size());
  omp_set_num_threads(3);
  const double three = global_norm(g.data(), g.size());
  omp_set_num_threads(saved);
  EXPECT_EQ(one, three);
  EXPECT_NEAR(one, std::sqrt(ref), 1e-9 * std::sqrt(ref));
  std::vector<float> p = {1, 2}, d = {0.5f, -1};
  sgd_step(p.data(), d.data(), 2, 0.1);
  EXPECT_FLOAT_EQ(p[0], 0.95f);
  EXPECT_FLOAT_EQ(p[1], 2.1f);
}

// The backend's fused pass (model/ops.h) against the reference composition: the mean over
// micro-batches, the norm, the clipping scale, the update and the model's copy, bit for bit,
// for AdamW and SGD, fp32 and bf16 copies, at sizes around the norm's chunk, at 1 and 3
// threads.
TEST(Optimizer, TheBackendsFusedStepIsTheReferenceBitForBit) {
  const Ops& ops = cpu_ops();
  const int saved = omp_get_max_threads();
  for (const size_t n : {size_t(1), size_t(1000), size_t(kNormChunk), size_t(3 * kNormChunk + 17)})
    for (const OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::sgd})
      for (const bool bf16 : {false, true})
        for (const int threads : {1, 3}) {
          omp_set_num_threads(threads);
          std::vector<float> p(n), m(n), v(n), g(n);
          for (size_t i = 0; i < n; ++i) {
            p[i] = std::sin(float(i) * 0.3f) * 0.1f;
            m[i] = std::cos(float(i)) * 1e-3f;
            v[i] = 1e-6f * float(i % 13);
            g[i] = std::cos(float(i) * 0.7f) * (i % 7 ? 1e-3f : 2.0f);
          }
          std::vector<float> rp = p, rm = m, rv = v, rg = g;
          const AdamWConfig c{0.9, 0.95, 1e-8, 0.1};
          const double lr = 7e-4;
          const int64_t step = 5;
          // the reference: scale by the mean of 2 micro-batches, the norm, clip to 0.5, update
          scale(rg.data(), n, 0.5f);
          const double norm = global_norm(rg.data(), n);
          const float clip = float(std::min(1.0, 0.5 / (norm + 1e-6)));
          scale(rg.data(), n, clip);
          if (kind == OptimizerKind::adamw)
            adamw_step(rp.data(), rm.data(), rv.data(), rg.data(), n, lr, c, step);
          else
            sgd_step(rp.data(), rg.data(), n, lr);
          // the backend
          const double got = std::sqrt(ops.scale_sum_squares(g.data(), int64_t(n), 0.5f));
          EXPECT_EQ(got, norm);
          std::vector<float> copy32(n);
          std::vector<uint16_t> copy16(n);
          ops.optimizer_step(p.data(), m.data(), v.data(), g.data(), int64_t(n),
                             optimizer_scalars(kind, lr, c, step, clip),
                             bf16 ? static_cast<void*>(copy16.data()) : copy32.data(), bf16);
          size_t bad = 0;
          for (size_t i = 0; i < n; ++i) {
            const bool same = p[i] == rp[i] &&
                              (kind == OptimizerKind::sgd || (m[i] == rm[i] && v[i] == rv[i])) &&
                              (bf16 ? copy16[i] == f32_to_bf16(rp[i]) : copy32[i] == rp[i]);
            bad += !same;
          }
          EXPECT_EQ(bad, 0u) << "n " << n << " " << optimizer_name(kind) << " bf16 " << bf16
                             << " threads " << threads;
        }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace tq::train
