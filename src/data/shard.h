// Token shards and the folder's meta.json: what `tiny-qwen3 prepare` writes and training reads.
//
// A shard is llm.c's uint32 layout: a header of 256 little-endian int32 ([0] magic 20240801,
// [1] version 7, [2] token count, the rest 0), then the count's uint32 token ids. A folder holds
// train_000000.bin, train_000001.bin, ... and val_000000.bin, ... (six digits at least; more
// past 999999) and meta.json, which names the tokenizer the ids belong to.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tq {
class AtomicFile;
class MappedFile;
}  // namespace tq

namespace tq::data {

constexpr int32_t kShardMagic = 20240801, kShardVersion = 7;
constexpr size_t kShardHeaderInts = 256, kShardHeaderBytes = kShardHeaderInts * 4;
constexpr uint64_t kMaxShardTokens = 2147483647;  // the header's int32 count
constexpr const char* kMetaFormat = "tiny-qwen3-shards";
constexpr int kMetaVersion = 1;

// Writes a shard atomically (temporary name, fsync, rename); Error past kMaxShardTokens.
void write_shard(const std::string& path, const uint32_t* ids, size_t n);

// A shard written as its ids come (no copy of the whole is held): the header's count is patched
// in by commit(). Destroyed uncommitted, it leaves nothing.
class ShardWriter {
 public:
  explicit ShardWriter(const std::string& path);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  void append(const uint32_t* ids, size_t n);  // Error past kMaxShardTokens in all
  void commit();
  uint64_t size() const { return n_; }

 private:
  std::unique_ptr<AtomicFile> file_;
  uint64_t n_ = 0;
};

// A shard mapped read-only, checked whole when opened: magic, version, the count against the
// file's size, and every id below vocab_size. Each failure is an Error naming the file.
class Shard {
 public:
  Shard(const std::string& path, uint32_t vocab_size);
  ~Shard();
  Shard(Shard&&) noexcept;
  Shard& operator=(Shard&&) noexcept;
  const uint32_t* ids() const { return ids_; }
  size_t size() const { return n_; }
  const std::string& path() const;

 private:
  std::unique_ptr<MappedFile> file_;
  const uint32_t* ids_ = nullptr;
  size_t n_ = 0;
};

// DIR/split_NNNNNN.bin for split "train" or "val", in shard order; Error if there is none, or
// one is missing from the run 0, 1, 2, ...
std::vector<std::string> list_shards(const std::string& dir, const std::string& split);
// The name of shard `index` of a split: "train_000003.bin".
std::string shard_name(const std::string& split, uint64_t index);

struct SplitMeta {
  uint64_t documents = 0;           // documents assigned to the split
  uint64_t tokens = 0;              // tokens in its shards, end-of-text ids included
  std::vector<std::string> shards;  // file names in the folder, in order
};

// meta.json: {"format": "tiny-qwen3-shards", "version": 1,
//   "tokenizer": {"path": ABSOLUTE, "sha256": HEX of the file's bytes, "vocab_size", "eos_id"},
//   "splits": {"train": {"documents", "tokens", "shards": [NAMES]}, "val": {...}},
//   "val_fraction", "seed", "shard_tokens", "command"}
struct ShardMeta {
  std::string tokenizer_path, tokenizer_sha256;
  uint32_t vocab_size = 0, eos_id = 0;
  SplitMeta train, val;
  double val_fraction = 0;
  uint64_t seed = 0, shard_tokens = 0;
  std::string command;
};

std::string meta_json(const ShardMeta& m);                    // the text of meta.json
void write_meta(const std::string& dir, const ShardMeta& m);  // DIR/meta.json, atomically
// DIR/meta.json, validated: a missing or foreign file, a field missing or of the wrong type,
// counts out of range, shard names that are not the split's own plain names (no "../x" or
// "/abs"), or counts that disagree with them are an Error of one line.
ShardMeta read_meta(const std::string& dir);

}  // namespace tq::data
