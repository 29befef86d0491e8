// Batches from token shards (data/shard.h): llm.c's loader over a split's shards concatenated
// in name order, sequential or shuffled by window, wrapping into a new epoch at the end.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/shard.h"
#include "model/qwen3.h"

namespace tq::train {

// DIR/meta.json of shards that a model of `c` reads: Error (one line) where DIR holds no shards,
// or their tokenizer has more ids than c's vocabulary.
data::ShardMeta read_shards_for(const std::string& dir, const Config& c);

// A split's shards as one stream of ids, each shard checked (ids below vocab_size) when opened.
class TokenStream {
 public:
  TokenStream(const std::string& dir, const std::string& split, uint32_t vocab_size);
  uint64_t size() const { return total_; }
  void read(uint64_t at, size_t n, int32_t* out) const;  // ids [at, at + n), across shards

 private:
  std::vector<data::Shard> shards_;
  std::vector<uint64_t> starts_;  // each shard's first position in the stream
  uint64_t total_ = 0;
};

enum class DataOrder { sequential, shuffled };
DataOrder parse_data_order(const std::string& s);
const char* data_order_name(DataOrder o);

// Attention within a row of a batch: causal over the whole row, or block-causal over the
// documents packed in it (each followed by the shards' end-of-text id: mark_documents in
// model/qwen3.h), TorchTitan's packed-document attention.
enum class AttentionMask { causal, block_causal };
AttentionMask parse_attention(const std::string& s);
const char* attention_name(AttentionMask a);

// Window w is the B*T + 1 ids from w*B*T: row r's inputs are [r*T, (r+1)*T) of it and its
// targets the same shifted by one (llm.c). An epoch has floor((L - 1) / (B*T)) windows of a
// stream of L ids; batches take them in order (sequential), or in a permutation drawn for each
// epoch (shuffled): Fisher-Yates from std::mt19937_64 seeded with std::seed_seq{seed low 32
// bits, seed high 32 bits, epoch low, epoch high}, each draw x mod (n - i) with x redrawn while
// below 2^64 mod (n - i).
class BatchLoader {
 public:
  BatchLoader(const TokenStream& s, int64_t B, int64_t T, DataOrder order, uint64_t seed);
  uint64_t windows() const { return windows_; }  // per epoch
  void next(Batch& b);                           // the next window, then advance
  void skip();                                   // advance past the next window unread
  uint64_t epoch() const { return epoch_; }
  uint64_t position() const { return pos_; }     // windows taken in this epoch
  void seek(uint64_t epoch, uint64_t position);  // continue there (a resumed run); Error if past
  // The window taken at (epoch, position): what next() would load there.
  uint64_t window_at(uint64_t epoch, uint64_t position);
  void load(uint64_t window, Batch& b) const;

 private:
  const TokenStream& s_;
  int64_t B_, T_;
  DataOrder order_;
  uint64_t seed_, windows_;
  uint64_t epoch_ = 0, pos_ = 0;
  std::vector<uint64_t> perm_;
  uint64_t perm_epoch_ = ~uint64_t(0);
  mutable std::vector<int32_t> buf_;
};

}  // namespace tq::train
