#include "infer/eval.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string_view>

#include "cpu/gemm.h"
#include "cpu/runtime.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "infer/model.h"
#include "io/file.h"
#include "io/model_file.h"
#include "model/ops.h"
#include "train/data.h"

namespace tq::infer {

WindowLoss window_loss(Qwen3& model, const ReadIds& read, uint64_t windows, int64_t B, int64_t T,
                       int32_t eos, const std::vector<uint32_t>& token_bytes) {
  WindowLoss r;
  std::vector<int32_t> buf;
  Batch b;
  b.T = T;
  for (uint64_t w = 0; w < windows; w += uint64_t(b.B)) {
    b.B = int64_t(std::min<uint64_t>(uint64_t(B), windows - w));
    // rows w.. of T + 1 ids each, every row's last id the next one's first: one read
    const size_t n = size_t(b.B * T);
    buf.resize(n + 1);
    read(w * uint64_t(T), n + 1, buf.data());
    b.tokens.assign(buf.begin(), buf.end() - 1);
    b.targets.assign(buf.begin() + 1, buf.end());
    b.doc_start.clear();
    if (eos >= 0) mark_documents(b, eos);
    r.nats += model.forward(b) * double(n);  // (forward: the mean over its rows)
    if (!token_bytes.empty())
      for (const int32_t id : b.targets)
        r.bytes += size_t(id) < token_bytes.size() ? token_bytes[size_t(id)] : 0;
  }
  r.targets = windows * uint64_t(T);
  return r;
}

namespace {

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Each id's bytes in text: what the decoder gives for it alone, before any UTF-8 repair (a
// byte-level token may hold part of a character). Special tokens (the end-of-text id that ends
// every document) are no text: 0 bytes, though their cross-entropy counts.
std::vector<uint32_t> token_bytes(const text::Tokenizer& tok) {
  std::vector<uint32_t> n(tok.vocab_size());
  std::string s;
  for (uint32_t id = 0; id < n.size(); ++id) {
    s.clear();
    bool first = true;
    try {
      tok.decode_append(&id, 1, true, s, first);
    } catch (const Error&) {  // an id the vocabulary leaves out: no token has it
      continue;
    }
    n[id] = uint32_t(s.size());
  }
  return n;
}

std::string commas(uint64_t v) {
  return with_commas(int64_t(v));
}

}  // namespace

int eval_command(const EvalArgs& a) {
  if (a.data.empty() == a.text.empty())
    throw Error(a.data.empty() ? "give the text to evaluate on: --data DIR (token shards) or "
                                 "--text FILE (UTF-8)"
                               : "--data and --text exclude each other: give one");
  if (a.tokens && *a.tokens < 1)
    throw Error("--tokens must be 1 or more, got " + std::to_string(*a.tokens));
  if (a.batch && *a.batch < 1)
    throw Error("--batch must be 1 or more, got " + std::to_string(*a.batch));
  if (!a.data.empty() && a.split != "val" && a.split != "train")
    throw Error("--split must be val or train, got '" + a.split + "'");
  const ModelInfo m = open_model(a.model, a.preset, a.dtype, a.attention);
  const Config& c = *m.cfg;
  // T: the recorded run's (its validation's windows), else the walkthrough record's
  const int64_t T = a.seq_len ? *a.seq_len
                    : m.run   ? m.run->T
                    : m.file.record && m.file.record->seq_len > 0
                        ? m.file.record->seq_len
                        : std::min<int64_t>(2048, c.max_ctx);
  if (T < 1 || T > c.max_ctx)
    throw Error("--seq-len must be in 1.." + std::to_string(c.max_ctx) + " for " + c.name +
                ", got " + std::to_string(T));
  const int64_t B = a.batch ? *a.batch : m.run ? m.run->B : 1;

  // The ids, their end-of-text id, and the tokenizer for bits per byte (or why there is none).
  std::optional<train::TokenStream> stream;
  std::vector<int32_t> ids;
  ReadIds read;
  uint64_t have = 0;
  int32_t eos = -1;
  std::optional<text::Tokenizer> tok;
  std::string no_bpb, source;
  if (!a.data.empty()) {
    const data::ShardMeta meta = train::read_shards_for(a.data, c);
    if (!m.tokenizer_sha256.empty() && meta.tokenizer_sha256 != m.tokenizer_sha256)
      throw Error("--data " + a.data + " holds another tokenizer's ids (SHA-256 " +
                  meta.tokenizer_sha256.substr(0, 16) + "...) than " + a.model +
                  " was trained on (" + m.tokenizer_sha256.substr(0, 16) + "...)");
    stream.emplace(a.data, a.split, uint32_t(c.V));
    have = stream->size();
    read = [&](uint64_t at, size_t n, int32_t* out) { stream->read(at, n, out); };
    eos = int32_t(meta.eos_id);
    source = a.data + " " + a.split + " split";
    const std::string path = a.tokenizer.empty() ? meta.tokenizer_path : a.tokenizer;
    if (!a.tokenizer.empty()) {  // given: it must be the shards' own
      tok.emplace(open_tokenizer(m, a.tokenizer));
      if (data::sha256_file(a.tokenizer) != meta.tokenizer_sha256)
        throw Error("--tokenizer " + a.tokenizer + " is not the tokenizer of " + a.data +
                    " (its meta.json records SHA-256 " + meta.tokenizer_sha256.substr(0, 16) +
                    "...)");
    } else if (!is_file(path)) {
      no_bpb = "the shards' tokenizer " + path + " is not there: pass it as --tokenizer FILE";
    } else if (data::sha256_file(path) != meta.tokenizer_sha256) {
      no_bpb = "the shards' tokenizer " + path +
               " has changed since prepare (its SHA-256 is not meta.json's): pass the one they " +
               "were made with as --tokenizer FILE";
    } else {
      try {
        tok.emplace(open_tokenizer(m, path));
      } catch (const Error& e) {
        no_bpb = e.what();
      }
    }
  } else {
    tok.emplace(open_tokenizer(m, a.tokenizer));
    // one document, as prepare encodes each: its ids, then the end-of-text id
    const MappedFile f(a.text);
    std::vector<uint32_t> u;
    tok->encode({reinterpret_cast<const char*>(f.data()), f.size()}, u);
    const std::optional<uint32_t> e = tok->end_of_text();
    if (!u.empty() && e) u.push_back(*e);
    eos = e ? int32_t(*e) : -1;  // (none: the file is one document, block-causal is causal)
    ids.assign(u.begin(), u.end());
    have = ids.size();
    read = [&](uint64_t at, size_t n, int32_t* out) {
      std::copy(ids.begin() + ptrdiff_t(at), ids.begin() + ptrdiff_t(at + n), out);
    };
    source = a.text;
  }
  if (m.attention != train::AttentionMask::block_causal) eos = -1;

  // The trainer's validation windows: as many whole ones as the first --tokens targets hold
  if (have < uint64_t(T) + 1)
    throw Error(source + " holds " + std::to_string(have) + " tokens, fewer than one window of " +
                "--seq-len " + std::to_string(T) + " + 1: give a shorter --seq-len");
  const uint64_t all = (have - 1) / uint64_t(T);
  const uint64_t windows =
      a.tokens ? std::clamp<uint64_t>(uint64_t(*a.tokens) / uint64_t(T), 1, all) : all;
  const int64_t rows = int64_t(std::min<uint64_t>(uint64_t(B), windows));

  const Ops& ops = cpu_ops();
  const MemoryPlan plan = memory_plan(c, m.dtype, rows, T, ops, Use::eval);
  // + the pieces load_params reads the weights by (one tensor piece in fp32 and its source's)
  const double need = double(plan.total()) + 2.0 * double(kLoadPiece) * 4;
  const double avail = cpu::available_memory_bytes();
  if (need > avail) {
    char msg[240];
    std::snprintf(msg, sizeof msg,
                  "%s in %s at B=%lld, T=%lld needs %.1f GiB (parameters, activations, scratch), "
                  "only %.1f GiB available in host memory",
                  c.name.c_str(), dtype_name(m.dtype), (long long)rows, (long long)T,
                  need / (1 << 30), avail / (1 << 30));
    throw Error(msg);
  }
  const std::vector<uint32_t> bytes_of =
      tok && no_bpb.empty() ? token_bytes(*tok) : std::vector<uint32_t>{};
  const char* attention = train::attention_name(m.attention);
  const double mib = 1.0 / (1 << 20);
  if (!a.json) {
    std::printf("model: %s (%s, %s, %s, %s attention)\n", a.model.c_str(), m.file.kind.c_str(),
                c.name.c_str(), dtype_name(m.dtype), attention);
    std::string kernels = cpu::kernels_name();  // (less a library taken for backward's dx)
    if (const size_t dx = kernels.rfind(", "); kernels.find(" for fp32 dx") != kernels.npos)
      kernels.resize(dx);
    std::printf("device: CPU(threads=%d, %s)\n", a.threads, kernels.c_str());
    std::printf("memory: %.1f MiB planned (parameters %.1f, activations %.1f, scratch %.1f)\n",
                plan.total() * mib, plan.params * mib, plan.activations * mib, plan.scratch * mib);
    std::printf("data: %s, %s tokens: %s windows of %lld + 1, %lld a forward\n", source.c_str(),
                commas(have).c_str(), commas(windows).c_str(), (long long)T, (long long)rows);
    std::fflush(stdout);
  }

  Qwen3 model(c, m.dtype, rows, T, ops, Use::eval);
  load_weights(m, model);
  const auto t0 = std::chrono::steady_clock::now();
  const WindowLoss r = window_loss(model, read, windows, rows, T, eos, bytes_of);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double loss = r.nats / double(r.targets);
  std::optional<double> bpb;
  if (!bytes_of.empty()) {
    if (r.bytes > 0)
      bpb = r.nats / std::log(2.0) / double(r.bytes);
    else
      no_bpb = "the targets hold no text bytes (only special tokens)";
  }

  if (a.json) {
    nlohmann::ordered_json j;
    j["model"] = a.model;
    j["preset"] = c.name;
    j["dtype"] = dtype_name(m.dtype);
    j["attention"] = attention;
    if (!a.data.empty())
      j["data"] = a.data, j["split"] = a.split;
    else
      j["text"] = a.text;
    j["seq_len"] = T;
    j["batch"] = rows;
    j["windows"] = windows;
    j["tokens"] = r.targets;
    j["loss"] = loss;
    j["perplexity"] = std::exp(loss);
    j["bits_per_byte"] = bpb ? nlohmann::ordered_json(*bpb) : nlohmann::ordered_json();
    if (bpb)
      j["bytes"] = r.bytes;
    else
      j["bits_per_byte_missing"] = no_bpb;
    j["nats"] = r.nats;
    j["seconds"] = s;
    j["memory_bytes"] = plan.total();
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("loss: %.6f\n", loss);
  std::printf("perplexity: %.4f\n", std::exp(loss));
  if (bpb)
    std::printf("bits per byte: %.6f\n", *bpb);
  else
    std::printf("bits per byte: not computed: %s\n", no_bpb.c_str());
  std::printf("tokens: %s targets in %s windows", commas(r.targets).c_str(),
              commas(windows).c_str());
  if (bpb) std::printf(", %s bytes of text", commas(r.bytes).c_str());
  std::printf("\ntime: %.2f s (%.0f tokens/s)\n", s, double(r.targets) / s);
  return 0;
}

}  // namespace tq::infer
