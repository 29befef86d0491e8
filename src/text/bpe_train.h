// Byte-level BPE training with Hugging Face `tokenizers`' BpeTrainer rule: words counted from
// the pre-tokenizer's pieces, then the most frequent pair merged, a tie going to the pair of
// smallest ids, the pair counts kept as that trainer keeps them (so the merges are its merges).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/tokenizer.h"

namespace tq::text {

struct BpeTrainOptions {
  size_t vocab_size = 2048;  // bytes + merged tokens + special tokens
  std::vector<std::string> special_tokens = {"<|endoftext|>"};
  uint64_t min_frequency = 0;  // a pair seen fewer times ends the training
};

class BpeTrainer {
 public:
  // Qwen's normalizer (NFC) and pre-tokenizer (its Split regex, then ByteLevel).
  BpeTrainer();
  // Counts the words of text, a line at a time with its line ending as the library's
  // train_from_files reads files (invalid UTF-8 is replaced as text/utf8.h says).
  void feed(std::string_view text);
  // Adds another trainer's counts (one per thread).
  void absorb(const BpeTrainer& other);
  size_t distinct_words() const { return counts_.size(); }

  struct Result {
    std::string json;  // the tokenizer.json
    size_t merges = 0, vocab = 0;
  };
  // The tokenizer: the 256 byte tokens (ids 0..255, in byte-level character order), the
  // merged tokens in the order they were made, then the special tokens as added tokens.
  Result train(const BpeTrainOptions& opt) const;

 private:
  Tokenizer pipeline_;
  std::unordered_map<std::string, uint64_t> counts_;
};

// The normalizer, pre-tokenizer, post-processor and decoder of Qwen's tokenizer.json, which
// tokenizer-train writes around its model.
std::string qwen_pipeline_json();

}  // namespace tq::text
