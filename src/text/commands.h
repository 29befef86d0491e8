// The tokenizer commands: encode, decode, tokenizer-train. Each streams its input (a 1 GB input
// needs no 1 GB buffer) and writes a file (--output/--out) atomically, or stdout.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tq::text {

struct EncodeArgs {
  std::string tokenizer, input = "-", output;  // output "": stdout
  bool jsonl = false;                          // lines of {"text": ...} in, lines of [ids] out
  bool no_special = false;  // leave out the post-processor's tokens (HF add_special_tokens=False)
  int threads = 0;          // 0: all
};
int encode_command(const EncodeArgs& a);

struct DecodeArgs {
  std::string tokenizer, input = "-", output;
  bool jsonl = false;         // lines of [ids] in, lines of {"text": ...} out
  bool skip_special = false;  // HF skip_special_tokens
};
int decode_command(const DecodeArgs& a);

struct TrainTokenizerArgs {
  std::vector<std::string> inputs;  // text files, each read a line at a time
  std::string jsonl;                // or: documents, one {"text": ...} per line
  double val_fraction = 0;          // with jsonl: leave out the documents prepare puts in val
  uint64_t seed = 0;
  std::string out;
  size_t vocab_size = 0;
  std::vector<std::string> special = {"<|endoftext|>"};
  uint64_t min_frequency = 0;
  int threads = 0;
};
int train_tokenizer_command(const TrainTokenizerArgs& a);

// The Brown corpus folder as JSONL documents (data/brown.h).
int brown_text_command(const std::string& dir, const std::string& out);

}  // namespace tq::text
