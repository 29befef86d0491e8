// A Hugging Face `tokenizer.json` tokenizer: the byte-level BPE family (Qwen, Llama 3, GPT-2),
// encoding and decoding as the `tokenizers` library does (ids identical).
//
// The pipeline, in the library's order: added tokens split out of the raw text (leftmost-
// longest, their lstrip/rstrip/single_word rules) -> normalizer (NFC, NFD, NFKC, NFKD,
// Lowercase, Replace, Prepend, Strip, Sequence) -> pre-tokenizer (Split with a regex or a
// string and any of its five behaviours, ByteLevel, Digits, Sequence) -> BPE (merges by rank,
// ignore_merges, byte_fallback, unk_token) -> post-processor (ByteLevel, TemplateProcessing,
// Sequence). Anything else in the file is an Error naming the field.
//
// Text that is not valid UTF-8 is read as Python's bytes.decode("utf-8", errors="replace")
// reads it: each maximal invalid subsequence becomes one U+FFFD (text/utf8.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tq::text {

struct TokenizerImpl;

class Tokenizer {
 public:
  // Error (one line naming the file and, for what is not supported, the field) when the file
  // is missing, not JSON, or holds what this library does not implement.
  static Tokenizer load(const std::string& path);
  static Tokenizer from_json(std::string_view json, const std::string& origin);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // HF `Tokenizer.encode(text, add_special_tokens)`: ids appended to `out`. Thread-safe (each
  // thread keeps its own cache of words it has merged).
  void encode(std::string_view text, std::vector<uint32_t>& out,
              bool add_special_tokens = true) const;
  std::vector<uint32_t> encode(std::string_view text, bool add_special_tokens = true) const {
    std::vector<uint32_t> ids;
    encode(text, ids, add_special_tokens);
    return ids;
  }
  // HF `Tokenizer.decode(ids, skip_special_tokens)`; an id past the vocabulary is an Error.
  std::string decode(const std::vector<uint32_t>& ids, bool skip_special_tokens = false) const;
  // The same in pieces: appends the decoder's bytes for ids to out before its final UTF-8
  // repair (text/utf8.h repair_utf8), so a stream can repair across pieces. `first`: no token
  // written yet (a tokenizer without a decoder puts a space between tokens).
  void decode_append(const uint32_t* ids, size_t n, bool skip_special_tokens, std::string& out,
                     bool& first) const;
  bool decodes_bytes() const;  // whether decode_append's output needs the repair

  // The normalized text HF's pipeline sees (added tokens kept as written), what
  // decode(encode(x)) gives back for a byte-level tokenizer.
  std::string normalize(std::string_view text) const;
  // The pre-tokenizer's pieces of already normalized text, as the BPE model receives them
  // (byte-level: bytes mapped to their printable characters). For the BPE trainer.
  void pre_tokenize(std::string_view normalized,
                    const std::function<void(std::string_view piece)>& emit) const;

  // Ids: the model's vocabulary and the added tokens (HF get_vocab_size(true)): one past the
  // largest id.
  uint32_t vocab_size() const;
  std::optional<uint32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(uint32_t id) const;
  bool is_special(uint32_t id) const;
  // The end-of-text id: the first of <|endoftext|>, <|end_of_text|>, </s>, <eos> that is a
  // token, else nullopt.
  std::optional<uint32_t> end_of_text() const;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  std::unique_ptr<TokenizerImpl> impl_;
  friend class StreamEncoder;
};

// Encodes one text that arrives in pieces of any size (a 1 GB file needs no 1 GB buffer), with
// the ids `Tokenizer::encode` gives the whole text: it holds back only the tail whose
// normalization, added-token matching or pre-tokenization could still depend on bytes to come.
class StreamEncoder {
 public:
  using Sink = std::function<void(const uint32_t* ids, size_t n)>;
  // chunk_bytes: how much raw text it gathers before encoding a chunk (tests make it small).
  StreamEncoder(const Tokenizer& tok, Sink sink, bool add_special_tokens = true,
                size_t chunk_bytes = size_t(1) << 20);
  void feed(std::string_view bytes);
  void finish();  // encodes what is held and applies the post-processor

 private:
  void flush(bool final);
  void emit(std::vector<uint32_t>& ids);
  const Tokenizer& tok_;
  Sink sink_;
  bool add_special_;
  size_t chunk_;
  std::string pending_;  // raw bytes not yet encoded
  std::string carry_;    // normalized text the pre-tokenizer has not settled
  bool started_ = false;
};

}  // namespace tq::text
