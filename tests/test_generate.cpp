// Generation: attention over the KV cache, the cached forward against the full one, sampling.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/common.h"
#include "cpu/layers.h"
#include "infer/generate.h"
#include "infer/sampler.h"
#include "model/init.h"
#include "model/qwen3.h"
#include "ref/layers.h"
#include "testing.h"
#include "text/utf8.h"

namespace tq {
namespace {

// The decode step's attention is causal attention's last row: B sequences of len[b] cached
// rows (in a cache of Tc rows each), fp32 and in bf16 storage.
TEST(Generate, DecodeAttentionIsTheLastRowOfCausalAttention) {
  const int64_t B = 3, H = 8, KVH = 2, D = 32, Tc = 40;
  const std::vector<int32_t> len = {1, 17, 40};
  const std::vector<float> q = test::to_f(test::randn(size_t(B * H * D), 1)),
                           kc = test::to_f(test::randn(size_t(B * Tc * KVH * D), 2)),
                           vc = test::to_f(test::randn(size_t(B * Tc * KVH * D), 3));
  for (bool h16 : {false, true}) {
    const auto as16 = [](const std::vector<float>& x) {
      std::vector<uint16_t> u(x.size());
      for (size_t i = 0; i < x.size(); ++i) u[i] = f32_to_bf16(x[i]);
      return u;
    };
    // the values the kernel sees (bf16 storage rounds them)
    const auto seen = [&](const std::vector<float>& x) {
      std::vector<double> d(x.size());
      for (size_t i = 0; i < x.size(); ++i) d[i] = h16 ? round_bf16(x[i]) : x[i];
      return d;
    };
    std::vector<float> out(size_t(B * H * D));
    std::vector<uint16_t> out16(out.size());
    const std::vector<uint16_t> q16 = as16(q), k16 = as16(kc), v16 = as16(vc);
    if (h16)
      cpu::attention_decode(
          reinterpret_cast<float*>(out16.data()), reinterpret_cast<const float*>(q16.data()),
          reinterpret_cast<const float*>(k16.data()), reinterpret_cast<const float*>(v16.data()),
          len.data(), B, H, KVH, D, Tc, true, true);
    else
      cpu::attention_decode(out.data(), q.data(), kc.data(), vc.data(), len.data(), B, H, KVH, D,
                            Tc, false, false);
    const std::vector<double> qd = seen(q), kd = seen(kc), vd = seen(vc);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t t = len[size_t(b)];
      // sequence b as a causal batch of one whose last query is the decode step's
      std::vector<double> qs(size_t(t * H * D), 0.0), o(qs.size()), lse(size_t(H * t));
      std::copy_n(qd.begin() + b * H * D, H * D, qs.begin() + (t - 1) * H * D);
      const std::vector<double> ks(kd.begin() + b * Tc * KVH * D,
                                   kd.begin() + (b * Tc + t) * KVH * D),
          vs(vd.begin() + b * Tc * KVH * D, vd.begin() + (b * Tc + t) * KVH * D);
      ref::attention_forward(o.data(), lse.data(), qs.data(), ks.data(), vs.data(), 1, t, H, KVH,
                             D);
      for (int64_t i = 0; i < H * D; ++i) {
        const double want = o[size_t((t - 1) * H * D + i)];
        const double got =
            h16 ? bf16_to_f32(out16[size_t(b * H * D + i)]) : out[size_t(b * H * D + i)];
        // bf16: the output's rounding (2^-8 relative) and the operands' exact products
        ASSERT_NEAR(got, want, h16 ? 8e-3 * std::fabs(want) + 1e-6 : 2e-6)
            << "h16 " << h16 << " b " << b << " i " << i;
      }
    }
  }
}

Config tiny(bool tied) {
  //        name    V   C   L  H  KVH D   F   ctx  theta tied eps
  return {"tiny", 97, 32, 2, 4, 2, 16, 48, 64, 1e4, tied, 1e-6f};
}

// Prefill and decode over the cache give the logits the full forward gives at every position
// (fp32: to 1e-4; bf16, whose attention rounds P to bf16 in the full forward only: to 0.1), for
// three sequences of different lengths decoded together.
TEST(Generate, CachedLogitsMatchTheFullForward) {
  for (DType dt : {DType::f32, DType::bf16})
    for (bool tied : {true, false}) {
      const Config c = tiny(tied);
      const ParamLayout p = make_layout(c);
      std::vector<float> w(p.total);
      init_params(w.data(), c, p, 5);
      // weights 10x the initialization's (norms kept), so that the logits are O(1) to O(10), as a
      // trained model's, and the tolerance means something
      for (const ParamView& v : p.params)
        if (v.shape.size() > 1)
          for (size_t i = 0; i < v.numel; ++i) w[v.offset + i] *= 10;
      const std::vector<std::vector<int32_t>> prompts = {
          {5, 17, 3, 90, 42}, {7}, {11, 12, 13, 14, 15, 16, 17, 18, 19}};
      const int64_t B = 3, steps = 8, T = 9 + steps;
      Qwen3 gen(c, dt, B, T, cpu_ops(), Use::generate), full(c, dt, 1, T, cpu_ops(), Use::eval);
      gen.set_params(w.data());
      full.set_params(w.data());
      std::vector<std::vector<int32_t>> seq = prompts;
      std::vector<std::vector<std::vector<float>>> got(B);  // [b][step] logits
      std::vector<float> row(size_t(c.V)), rows(size_t(B * c.V));
      for (int64_t b = 0; b < B; ++b) {
        gen.prefill(b, seq[b].data(), int64_t(seq[b].size()), row.data());
        got[b].push_back(row);
      }
      for (int64_t s = 0; s < steps; ++s) {
        std::vector<int32_t> next;
        for (int64_t b = 0; b < B; ++b) {
          seq[b].push_back(int32_t((s * 37 + b * 11 + 3) % c.V));
          next.push_back(seq[b].back());
        }
        gen.decode(next.data(), B, rows.data());
        for (int64_t b = 0; b < B; ++b)
          got[b].emplace_back(rows.begin() + b * c.V, rows.begin() + (b + 1) * c.V);
      }
      for (int64_t b = 0; b < B; ++b) {
        EXPECT_EQ(gen.cached(b), int64_t(seq[b].size()));
        Batch batch;
        batch.B = 1, batch.T = int64_t(seq[b].size());
        batch.tokens = seq[b];
        batch.targets.assign(seq[b].size(), 0);
        full.forward(batch);
        std::vector<float> want(size_t(batch.T * c.V));
        full.logits(want.data(), 0, batch.T);
        const int64_t first = int64_t(prompts[b].size()) - 1;  // the prefill's last position
        float largest = 0;
        for (float x : want) largest = std::max(largest, std::fabs(x));
        EXPECT_GT(largest, 2.0f);
        for (size_t k = 0; k < got[b].size(); ++k)
          for (int64_t v = 0; v < c.V; ++v)
            ASSERT_NEAR(got[b][k][v], want[size_t((first + int64_t(k)) * c.V + v)],
                        dt == DType::f32 ? 1e-4 : 0.1)
                << dtype_name(dt) << " tied " << tied << " sequence " << b << " step " << k;
      }
    }
}

TEST(Generate, RefusesWhatDoesNotFit) {
  const Config c = tiny(true);
  Qwen3 gen(c, DType::f32, 2, 6, cpu_ops(), Use::generate);
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7};
  std::vector<float> out(size_t(2 * c.V));
  EXPECT_THROW(gen.prefill(0, ids.data(), 7, out.data()), Error);  // past T
  EXPECT_THROW(gen.prefill(2, ids.data(), 3, out.data()), Error);  // past B
  EXPECT_THROW(gen.decode(ids.data(), 1, out.data()), Error);      // nothing cached yet
  gen.prefill(0, ids.data(), 6, out.data());
  EXPECT_THROW(gen.decode(ids.data(), 1, out.data()), Error);  // the cache is full
  Batch b = fixed_batch(1, 6, c.V);
  EXPECT_THROW(gen.forward(b), Error);
  Qwen3 ev(c, DType::f32, 1, 6, cpu_ops(), Use::eval);
  EXPECT_THROW(ev.backward(), Error);
  EXPECT_THROW(ev.sgd_update(0.1f), Error);
  std::vector<float> g(make_layout(c).total);
  EXPECT_THROW(ev.get_grads(g.data()), Error);
  EXPECT_THROW(ev.grads_into(g.data()), Error);
  EXPECT_THROW(ev.prefill(0, ids.data(), 3, out.data()), Error);
}

TEST(Generate, PlansNoGradientsAndTheCache) {
  const Config& c = preset("debugmodel");
  for (DType dt : {DType::f32, DType::bf16}) {
    const MemoryPlan g = memory_plan(c, dt, 4, 100, cpu_ops(), Use::generate);
    EXPECT_EQ(g.grads, 0u);
    const size_t es = bf16_acts(cpu_ops(), dt) ? 2 : 4;
    EXPECT_EQ(g.cache, size_t(c.L * 2 * 4 * 100 * c.KVH * c.D) * es);
    const MemoryPlan e = memory_plan(c, dt, 4, 100, cpu_ops(), Use::eval);
    EXPECT_EQ(e.grads, 0u);
    EXPECT_EQ(e.cache, 0u);
    EXPECT_LT(e.activations, memory_plan(c, dt, 4, 100, cpu_ops(), Use::train).activations / 4);
  }
}

// Sampling follows Hugging Face's warpers: greedy is the argmax; top-k and top-p keep what
// they say; a seed gives the same draws; the draws follow the kept probabilities.
TEST(Sampler, KeepsWhatItsFiltersKeep) {
  const std::vector<float> logits = {std::log(0.1f), std::log(0.2f), std::log(0.7f), -1e9f};
  const auto counts = [&](infer::SamplerConfig c, int n) {
    infer::Sampler s(c, 0);
    std::vector<int> k(logits.size());
    for (int i = 0; i < n; ++i) ++k[size_t(s.next(logits.data(), 4))];
    return k;
  };
  infer::SamplerConfig c;
  c.greedy = true;
  EXPECT_EQ(counts(c, 50), (std::vector<int>{0, 0, 50, 0}));
  c = {};
  c.temperature = 0;
  EXPECT_EQ(counts(c, 50), (std::vector<int>{0, 0, 50, 0}));
  c = {};
  c.top_k = 1;
  c.temperature = 5;
  EXPECT_EQ(counts(c, 50), (std::vector<int>{0, 0, 50, 0}));
  c = {};
  const std::vector<int> all = counts(c, 20000);
  EXPECT_NEAR(all[0] / 20000.0, 0.1, 0.01);
  EXPECT_NEAR(all[1] / 20000.0, 0.2, 0.012);
  EXPECT_EQ(all[3], 0);
  c.top_p = 0.75;  // 0.7 alone falls short of 0.75: 0.7 and 0.2 stay, renormalized
  const std::vector<int> nucleus = counts(c, 20000);
  EXPECT_EQ(nucleus[0], 0);
  EXPECT_NEAR(nucleus[1] / 20000.0, 0.2 / 0.9, 0.012);
  c = {};
  c.top_k = 2;
  EXPECT_EQ(counts(c, 2000)[0], 0);
  c = {};
  c.seed = 7;
  EXPECT_EQ(counts(c, 300), counts(c, 300));
  infer::Sampler s(c, 0);
  double lp = 0;
  const int32_t id = s.next(logits.data(), 4, &lp);
  EXPECT_NEAR(lp, std::log(std::vector<double>{0.1, 0.2, 0.7}[size_t(id)]), 1e-6);
  for (double bad : {0.0, -0.5, 1.5}) {
    c = {};
    c.top_p = bad;
    EXPECT_THROW(infer::check(c), Error);
  }
  c = {};
  c.temperature = -1;
  EXPECT_THROW(infer::check(c), Error);
}

// generate() stops each sequence at end-of-text or the token budget, and its picks are the
// sampler's from the cached logits.
TEST(Generate, StopsAtEndOfTextOrTheBudget) {
  const Config c = tiny(true);
  const ParamLayout p = make_layout(c);
  std::vector<float> w(p.total);
  init_params(w.data(), c, p, 9);
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {4}};
  infer::GenerateConfig gc;
  gc.max_new_tokens = 12;
  gc.sampling.greedy = true;
  Qwen3 gen(c, DType::f32, 2, infer::context_needed(prompts, 12), cpu_ops(), Use::generate);
  gen.set_params(w.data());
  const auto gens = infer::generate(gen, prompts, gc);
  ASSERT_EQ(gens.size(), 2u);
  for (const auto& g : gens) EXPECT_EQ(g.ids.size(), 12u);
  // the same again with the first sequence's 5th token as end-of-text: it stops there
  gc.eos = gens[0].ids[4];
  Qwen3 again(c, DType::f32, 2, infer::context_needed(prompts, 12), cpu_ops(), Use::generate);
  again.set_params(w.data());
  const auto stopped = infer::generate(again, prompts, gc);
  const size_t first =
      size_t(std::find(gens[0].ids.begin(), gens[0].ids.end(), gc.eos) - gens[0].ids.begin());
  EXPECT_EQ(stopped[0].ids.size(), first + 1);
  EXPECT_TRUE(stopped[0].stopped_at_eos);
  EXPECT_EQ(std::vector<int32_t>(gens[0].ids.begin(), gens[0].ids.begin() + int64_t(first) + 1),
            stopped[0].ids);
}

// Text as it streams: a character split across tokens is held until its last byte; invalid
// bytes become U+FFFD as the whole decode makes them; the pieces add up to decode(ids).
TEST(Generate, TextStreamsWholeCharacters) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[text::byte_level_chars()[size_t(b)]] = b;  // byte b: id b
  const nlohmann::json j = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
      {"decoder", {{"type", "ByteLevel"}}}};
  const text::Tokenizer tok = text::Tokenizer::from_json(j.dump(), "bytes.json");
  const std::string s = "a\xc3\xa9\xe2\x82\xac\xff!\xe2\x82";  // a, é, €, a stray byte, !, a cut €
  infer::TextStream ts(tok);
  std::vector<std::string> pieces;
  for (unsigned char ch : s) pieces.push_back(ts.add(int32_t(ch)));
  EXPECT_EQ(pieces[1], "");  // é's first byte: held
  EXPECT_EQ(pieces[2], "\xc3\xa9");
  EXPECT_EQ(pieces[4], "");
  EXPECT_EQ(pieces[5], "\xe2\x82\xac");
  std::string all;
  for (const std::string& p : pieces) all += p;
  all += ts.finish();
  std::vector<uint32_t> ids;
  for (unsigned char ch : s) ids.push_back(ch);
  EXPECT_EQ(all, tok.decode(ids));
  EXPECT_EQ(all, text::repair_utf8(s));
}

}  // namespace
}  // namespace tq
