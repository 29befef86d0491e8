// `tiny-qwen3 prepare`: documents -> token ids -> shards of a train and a val split, and the
// folder's meta.json (data/shard.h).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tq::data {

struct PrepareArgs {
  std::string tokenizer;            // a tokenizer.json (text/tokenizer.h)
  std::vector<std::string> inputs;  // each file one document, in this order
  std::string jsonl;                // or: each non-blank line {"text": "..."} one document
  std::string brown;                // or: a Brown corpus folder, each sample one document
  std::string out;                  // a folder that does not exist yet, or is empty
  double val_fraction = 0.05;       // [0, 1)
  uint64_t seed = 0;
  uint64_t shard_tokens = 100000000;  // 1..2^31-1
  int threads = 0;                    // 0: all
  std::string command_line;           // recorded in meta.json
};

// Encodes every document (Tokenizer::encode, then the end-of-text id; a document with no
// tokens adds nothing, not even that id), assigns whole documents to train or val
// (val_documents), writes their ids in document order into OUT/train_000000.bin, ... and
// OUT/val_000000.bin, ... of at most shard_tokens tokens each (a document may run on into the
// split's next shard), and OUT/meta.json. The output is the same for any thread count. It is
// written into OUT.tmp.PID and renamed to OUT at the end: a failure or an interrupt leaves no
// OUT. Prints a short summary; returns 0. Bad arguments or input are an Error.
int prepare(const PrepareArgs& args);

// How many of n documents go to val: k = floor(val_fraction * n + 0.5), at least 1 when
// val_fraction > 0 and n >= 2, and at most n - 1 (train keeps one).
uint64_t val_count(uint64_t n, double val_fraction);
// Which (sorted): the first k of a Fisher-Yates shuffle of 0..n-1, drawn from std::mt19937_64
// seeded with `seed` (the standard fixes its output): for i = 0 .. k-1, swap a[i] with a[j],
// j = i + draw(n - i), where draw(b) takes the next 64-bit output x, skips it while
// x < 2^64 mod b, and returns x mod b. Every platform gives the same documents.
std::vector<uint64_t> val_documents(uint64_t n, double val_fraction, uint64_t seed);

// What the tests change: past stream_bytes an input file is encoded as a stream
// (text::StreamEncoder), alone, so that neither it nor its ids are held whole; after_shard, if
// set, runs after each shard is finished (an interrupt test stops there).
struct PrepareTuning {
  uint64_t stream_bytes = uint64_t(64) << 20;
  std::function<void()> after_shard;
};
extern PrepareTuning prepare_tuning;

// The SHA-256 of a file's bytes, 64 lowercase hex digits.
std::string sha256_file(const std::string& path);

}  // namespace tq::data
