// A Qwen3 built for evaluation (Use::eval: forward only, one layer's activations reused, fewer
// rows or tokens than built) against the training model, and eval's windows (infer/eval.h).
#include <gtest/gtest.h>

#include <random>

#include "infer/eval.h"
#include "model/init.h"
#include "model/qwen3.h"
#include "testing.h"

namespace tq {
namespace {

Config tiny() {
  //        name    V   C   L  H  KVH D   F   ctx  theta tied eps
  return {"tiny", 97, 32, 3, 4, 2, 16, 48, 64, 1e4, true, 1e-6f};
}

std::vector<float> params(const Config& c) {
  const ParamLayout p = make_layout(c);
  std::vector<float> w(p.total);
  init_params(w.data(), c, p, 5);
  for (const ParamView& v : p.params)  // norms away from 1
    if (v.shape.size() == 1)
      for (size_t i = 0; i < v.numel; ++i) w[v.offset + i] = 1.0f + 0.1f * std::cos(float(i));
  return w;
}

// Made-up text: ids 1..V-1 with the eos 0 about one in five.
std::vector<int32_t> stream(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> ids(n);
  for (int32_t& x : ids) x = g() % 5 == 0 ? 0 : int32_t(1 + g() % 96);
  return ids;
}

// Rows of T + 1 ids from ids[at], as eval's windows take them; block-causal where docs.
Batch batch(const std::vector<int32_t>& ids, size_t at, int64_t B, int64_t T, bool docs) {
  Batch b;
  b.B = B, b.T = T;
  b.tokens.assign(ids.begin() + ptrdiff_t(at), ids.begin() + ptrdiff_t(at + size_t(B * T)));
  b.targets.assign(ids.begin() + ptrdiff_t(at + 1),
                   ids.begin() + ptrdiff_t(at + size_t(B * T) + 1));
  if (docs) mark_documents(b, 0);
  return b;
}

std::vector<float> logits(const Qwen3& m, int64_t n, int64_t V) {
  std::vector<float> l(size_t(n * V));
  m.logits(l.data(), 0, n);
  return l;
}

// The same loss and logits, bit for bit, as the training model at the same B and T: the same
// kernels in the same order, only the activations' storage differs.
TEST(Qwen3, EvalForwardEqualsTrainForward) {
  const Config c = tiny();
  const std::vector<float> w = params(c);
  const std::vector<int32_t> ids = stream(400, 1);
  // the optional kernels left out: the composed QK-norm + RoPE (into the scratch a forward-only
  // model keeps) and plain attention, as the CUDA backend runs them
  const Ops b = test::bare_ops();
  for (const Ops* o : {&cpu_ops(), &b})
    for (DType dt : {DType::f32, DType::bf16})
      for (bool docs : {false, true}) {
        const std::string what = o->name + " " + dtype_name(dt) + (docs ? " block-causal" : "");
        Qwen3 train(c, dt, 3, 20, *o), eval(c, dt, 3, 20, *o, Use::eval);
        train.set_params(w.data());
        eval.set_params(w.data());
        for (size_t at : {0, 60, 123}) {
          const Batch x = batch(ids, at, 3, 20, docs);
          ASSERT_EQ(eval.forward(x), train.forward(x)) << what << " at " << at;
          ASSERT_EQ(logits(eval, 60, c.V), logits(train, 60, c.V)) << what << " at " << at;
        }
        EXPECT_THROW(eval.backward(), Error) << what;
        EXPECT_THROW(eval.backward_sgd(0.1f), Error) << what;
        EXPECT_LT(memory_plan(c, dt, 3, 20, *o, Use::eval).total(),
                  memory_plan(c, dt, 3, 20, *o, Use::train).total())
            << what;
      }
}

// A forward of fewer rows or tokens than built (eval's last, partial batch) equals a model
// built for that size, bit for bit, and leaves nothing behind for the next full-size one.
TEST(Qwen3, EvalForwardOfFewerRowsEqualsASmallerModel) {
  const Config c = tiny();
  const std::vector<float> w = params(c);
  const std::vector<int32_t> ids = stream(400, 2);
  const Ops b = test::bare_ops();
  for (const Ops* o : {&cpu_ops(), &b})
    for (DType dt : {DType::f32, DType::bf16})
      for (bool docs : {false, true}) {
        const std::string what = o->name + " " + dtype_name(dt) + (docs ? " block-causal" : "");
        Qwen3 big(c, dt, 4, 24, *o, Use::eval);
        big.set_params(w.data());
        const Batch full = batch(ids, 7, 4, 24, docs);
        const double l0 = big.forward(full);
        for (const auto& [B, T] :
             std::vector<std::pair<int64_t, int64_t>>{{3, 24}, {1, 24}, {2, 9}, {4, 1}}) {
          const Batch x = batch(ids, 31, B, T, docs);
          Qwen3 small(c, dt, B, T, *o, Use::eval), trained(c, dt, B, T, *o);
          small.set_params(w.data());
          trained.set_params(w.data());
          const double l = big.forward(x);
          ASSERT_EQ(l, small.forward(x)) << what << " B " << B << " T " << T;
          ASSERT_EQ(l, trained.forward(x)) << what << " B " << B << " T " << T;
          ASSERT_EQ(logits(big, B * T, c.V), logits(small, B * T, c.V)) << what << " B " << B;
          EXPECT_THROW(big.logits(nullptr, 0, B * T + 1), Error) << what;
        }
        EXPECT_EQ(big.forward(full), l0) << what;
        EXPECT_THROW(big.forward(batch(ids, 0, 5, 24, docs)), Error) << what;  // more rows
        EXPECT_THROW(big.forward(batch(ids, 0, 4, 25, docs)), Error) << what;  // longer rows
      }
}

// eval's windows: window w is ids [w T, w T + T], B to a forward and the rest in one shorter,
// block-causal over eos 0 where asked; the summed loss is each window's alone, summed, and
// the bytes each target's.
TEST(Eval, WindowLossSumsEveryWindowOnce) {
  const Config c = tiny();
  const std::vector<float> w = params(c);
  const std::vector<int32_t> ids = stream(300, 3);
  const infer::ReadIds read = [&](uint64_t at, size_t n, int32_t* out) {
    ASSERT_LE(at + n, ids.size());
    std::copy(ids.begin() + ptrdiff_t(at), ids.begin() + ptrdiff_t(at + n), out);
  };
  std::vector<uint32_t> bytes(size_t(c.V));
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint32_t(i % 4);
  const int64_t T = 16;
  const uint64_t windows = 7;  // at B = 3: batches of 3, 3 and 1
  for (bool docs : {false, true}) {
    Qwen3 one(c, DType::f32, 1, T, cpu_ops(), Use::eval),
        three(c, DType::f32, 3, T, cpu_ops(), Use::eval);
    one.set_params(w.data());
    three.set_params(w.data());
    double nats = 0;
    uint64_t nbytes = 0;
    for (uint64_t k = 0; k < windows; ++k) {
      nats += one.forward(batch(ids, size_t(k * T), 1, T, docs)) * double(T);
      for (int64_t t = 1; t <= T; ++t) nbytes += bytes[size_t(ids[size_t(k * T + t)])];
    }
    const infer::WindowLoss r =
        infer::window_loss(three, read, windows, 3, T, docs ? 0 : -1, bytes);
    EXPECT_EQ(r.targets, windows * T);
    EXPECT_NEAR(r.nats, nats, 1e-6 * nats) << docs;  // (products of 3 rows and of 1)
    EXPECT_EQ(r.bytes, nbytes);
    EXPECT_EQ(infer::window_loss(three, read, windows, 3, T, docs ? 0 : -1).bytes, 0u);
  }
}

}  // namespace
}  // namespace tq
