#include "text/bpe_train.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_set>

#include "core/common.h"
#include "text/utf8.h"

namespace tq::text {
namespace {

using ojson = nlohmann::ordered_json;

// Qwen2/Qwen3's pre-tokenizer pattern (its tokenizer.json), which Oniguruma reads.
constexpr const char* kQwenPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

ojson byte_level_json() {
  return ojson{{"type", "ByteLevel"},
               {"add_prefix_space", false},
               {"trim_offsets", false},
               {"use_regex", false}};
}

ojson pipeline() {
  ojson j;
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", ojson::array({ojson{{"type", "Split"},
                                            {"pattern", {{"Regex", kQwenPattern}}},
                                            {"behavior", "Isolated"},
                                            {"invert", false}},
                                      byte_level_json()})}};
  j["post_processor"] = byte_level_json();
  j["decoder"] = byte_level_json();
  return j;
}

// A pair of token ids as one key; comparing keys compares the pairs as (left, right).
using Pair = uint64_t;
inline Pair pair_of(uint32_t a, uint32_t b) {
  return (uint64_t(a) << 32) | b;
}
struct PairHash {
  size_t operator()(Pair p) const {
    p ^= p >> 33;
    p *= 0xff51afd7ed558ccdull;
    p ^= p >> 33;
    return size_t(p);
  }
};

// The trainer's queue entry: the most frequent pair first, on a tie the smallest pair; `pos`
// the words to merge it in (those that had it when it was queued).
struct Merge {
  Pair pair;
  uint64_t count;
  std::vector<uint32_t> pos;
};
struct MergeOrder {
  bool operator()(const Merge& a, const Merge& b) const {  // true: a below b
    return a.count != b.count ? a.count < b.count : a.pair > b.pair;
  }
};

// The library's Word::merge: every non-overlapping (c1, c2) left to right becomes `rep`; the
// pair count changes it causes around each (the merged pair's own count is left as it is).
void merge_word(std::vector<uint32_t>& w, uint32_t c1, uint32_t c2, uint32_t rep,
                std::vector<std::pair<Pair, int>>& changes) {
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] != c1 || i + 1 >= w.size() || w[i + 1] != c2) continue;
    const uint32_t first = w[i], second = w[i + 1];
    if (i > 0) {
      changes.emplace_back(pair_of(w[i - 1], first), -1);
      changes.emplace_back(pair_of(w[i - 1], rep), 1);
    }
    w[i] = rep;
    w.erase(w.begin() + long(i) + 1);
    if (i + 1 < w.size()) {
      changes.emplace_back(pair_of(second, w[i + 1]), -1);
      changes.emplace_back(pair_of(rep, w[i + 1]), 1);
    }
  }
}

}  // namespace

std::string qwen_pipeline_json() {
  return pipeline().dump();
}

BpeTrainer::BpeTrainer()
    : pipeline_([] {
        ojson j = pipeline();
        ojson vocab = ojson::object();
        for (size_t b = 0; b < 256; ++b) vocab[byte_level_chars()[b]] = b;
        j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", ojson::array()}};
        return Tokenizer::from_json(j.dump(), "the BPE trainer's pipeline");
      }()) {}

void BpeTrainer::feed(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    size_t e = text.find('\n', i);
    e = e == std::string_view::npos ? text.size() : e + 1;
    const std::string norm = pipeline_.normalize(text.substr(i, e - i));
    pipeline_.pre_tokenize(norm, [&](std::string_view piece) { ++counts_[std::string(piece)]; });
    i = e;
  }
}

void BpeTrainer::absorb(const BpeTrainer& other) {
  for (const auto& [w, c] : other.counts_) counts_[w] += c;
}

BpeTrainer::Result BpeTrainer::train(const BpeTrainOptions& opt) const {
  const size_t n_special = opt.special_tokens.size();
  if (opt.vocab_size < 256 + n_special)
    throw Error("--vocab-size " + std::to_string(opt.vocab_size) + " leaves no room: the 256 " +
                "byte tokens and " + std::to_string(n_special) + " special tokens need " +
                std::to_string(256 + n_special));
  if (counts_.empty()) throw Error("no text to train on: the input is empty");

  // Ids as the library's trainer gives them: special tokens, then the alphabet (every byte's
  // character, sorted by code point), then each merged token as it is made.
  std::unordered_map<std::string, uint32_t> word_to_id;
  std::vector<std::string> id_to_word;
  for (const std::string& s : opt.special_tokens) {
    if (word_to_id.count(s)) throw Error("special token '" + s + "' is given twice");
    word_to_id[s] = uint32_t(id_to_word.size());
    id_to_word.push_back(s);
  }
  std::vector<std::pair<uint32_t, std::string>> alphabet;
  for (const std::string& c : byte_level_chars()) {
    size_t k = 0;
    alphabet.emplace_back(next_code_point(c, k), c);
  }
  std::sort(alphabet.begin(), alphabet.end());
  for (const auto& [cp, c] : alphabet) {
    if (word_to_id.count(c)) continue;
    word_to_id[c] = uint32_t(id_to_word.size());
    id_to_word.push_back(c);
  }

  // Words (sorted, so a run does not depend on hashing order) as ids, with their counts.
  std::vector<const std::pair<const std::string, uint64_t>*> sorted;
  sorted.reserve(counts_.size());
  for (const auto& e : counts_) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->first < b->first; });
  std::vector<std::vector<uint32_t>> words(sorted.size());
  std::vector<int64_t> counts(sorted.size());
  for (size_t w = 0; w < sorted.size(); ++w) {
    const std::string& s = sorted[w]->first;
    counts[w] = int64_t(sorted[w]->second);
    for (size_t i = 0; i < s.size();) {
      const size_t st = i;
      next_code_point(s, i);
      words[w].push_back(word_to_id.at(s.substr(st, i - st)));
    }
  }

  std::unordered_map<Pair, int64_t, PairHash> pair_counts;
  std::unordered_map<Pair, std::vector<uint32_t>, PairHash> where;
  for (size_t w = 0; w < words.size(); ++w)
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      const Pair p = pair_of(words[w][i], words[w][i + 1]);
      pair_counts[p] += counts[w];
      auto& pos = where[p];
      if (pos.empty() || pos.back() != w) pos.push_back(uint32_t(w));
    }
  std::priority_queue<Merge, std::vector<Merge>, MergeOrder> queue;
  auto drain = [&] {
    for (auto& [p, pos] : where) {
      const int64_t c = pair_counts[p];
      if (c > 0) {
        std::sort(pos.begin(), pos.end());
        pos.erase(std::unique(pos.begin(), pos.end()), pos.end());
        queue.push(Merge{p, uint64_t(c), std::move(pos)});
      }
    }
    where.clear();
  };
  drain();

  std::vector<std::pair<Pair, uint32_t>> merges;  // (pair, new id), in order
  std::vector<std::pair<Pair, int>> changes;
  while (word_to_id.size() < opt.vocab_size && !queue.empty()) {
    Merge top = queue.top();
    queue.pop();
    const int64_t now = pair_counts[top.pair];
    if (int64_t(top.count) != now) {  // counts changed since it was queued
      top.count = uint64_t(now);
      queue.push(std::move(top));
      continue;
    }
    if (top.count < 1 || opt.min_frequency > top.count) break;
    const uint32_t a = uint32_t(top.pair >> 32), b = uint32_t(top.pair);
    const std::string token = id_to_word[a] + id_to_word[b];
    auto found = word_to_id.find(token);
    uint32_t id;
    if (found != word_to_id.end()) {
      id = found->second;
    } else {
      id = uint32_t(id_to_word.size());
      id_to_word.push_back(token);
      word_to_id.emplace(token, id);
    }
    merges.emplace_back(top.pair, id);
    for (uint32_t w : top.pos) {
      changes.clear();
      merge_word(words[w], a, b, id, changes);
      for (const auto& [p, ch] : changes) {
        pair_counts[p] += int64_t(ch) * counts[w];
        if (ch > 0) {
          auto& pos = where[p];
          if (pos.empty() || pos.back() != w) pos.push_back(w);
        }
      }
    }
    drain();
  }

  // Our order: bytes (0..255), merged tokens as made, special tokens last. A pair merged twice
  // (the library's map keeps its later rank) is listed once, where it was merged last.
  std::vector<uint32_t> out_id(id_to_word.size());
  uint32_t next = 0;
  for (size_t i = n_special; i < id_to_word.size(); ++i) out_id[i] = next++;
  for (size_t i = 0; i < n_special; ++i) out_id[i] = next++;
  std::vector<std::string> by_out(id_to_word.size());
  for (size_t i = 0; i < id_to_word.size(); ++i) by_out[out_id[i]] = id_to_word[i];

  std::unordered_map<Pair, size_t, PairHash> last;
  for (size_t i = 0; i < merges.size(); ++i) last[merges[i].first] = i;
  ojson merge_list = ojson::array();
  size_t n_merges = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    if (last[merges[i].first] != i) continue;
    const Pair p = merges[i].first;
    merge_list.push_back({id_to_word[p >> 32], id_to_word[uint32_t(p)]});
    ++n_merges;
  }
  ojson vocab = ojson::object();
  for (uint32_t i = 0; i < by_out.size(); ++i) vocab[by_out[i]] = i;
  ojson added = ojson::array();
  for (size_t i = 0; i < n_special; ++i)
    added.push_back({{"id", out_id[i]},
                     {"content", opt.special_tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});

  ojson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  const ojson pipe = pipeline();
  for (const char* k : {"normalizer", "pre_tokenizer", "post_processor", "decoder"}) j[k] = pipe[k];
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merge_list}};
  return Result{j.dump(2) + "\n", n_merges, by_out.size()};
}

}  // namespace tq::text
