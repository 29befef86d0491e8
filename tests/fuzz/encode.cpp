// Any bytes as text, through two tokenizers (Qwen's pipeline, and GPT-2's ByteLevel regex with a
// prefix space), checked against themselves: the streaming encoder gives the whole-text ids at
// any chunking, and decode(encode(x)) is the normalized text (for the first: the second's
// prefix spaces stay in what it decodes). A difference aborts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/common.h"
#include "fuzz_input.h"
#include "text/bpe_train.h"
#include "text/tokenizer.h"

namespace {

std::vector<tq::text::Tokenizer> make_tokenizers() {
  tq::text::BpeTrainer tr;
  tr.feed(
      "The quick brown fox's 12345 jumps   over\n\nthe lazy dog.\r\n\t\xE4\xBD\xA0\xE5\xA5\xBD "
      "caf\xC3\xA9 e\xCC\x81 \xF0\x9F\x98\x80 -- (x) <|endoftext|> hello hello world world\n");
  tq::text::BpeTrainOptions o;
  o.vocab_size = 320;
  o.special_tokens = {"<|endoftext|>", "<|im_start|>"};
  nlohmann::json j = nlohmann::json::parse(tr.train(o).json);
  std::vector<tq::text::Tokenizer> out;
  out.push_back(tq::text::Tokenizer::from_json(j.dump(), "qwen-like"));
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  j["normalizer"] = {{"type", "NFKC"}};
  out.push_back(tq::text::Tokenizer::from_json(j.dump(), "gpt2-like"));
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<tq::text::Tokenizer> toks = make_tokenizers();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const auto& tok : toks) {
    const std::vector<uint32_t> whole = tok.encode(text);
    if (&tok == &toks[0] && tok.decode(whole) != tok.normalize(text)) std::abort();
    const size_t chunk = size ? 1 + data[0] % 16 : 1;
    std::vector<uint32_t> streamed;
    tq::text::StreamEncoder s(
        tok, [&](const uint32_t* p, size_t n) { streamed.insert(streamed.end(), p, p + n); }, true,
        chunk);
    for (size_t i = 0; i < size; i += 3) s.feed(text.substr(i, 3));
    s.finish();
    if (streamed != whole) std::abort();
  }
  return 0;
}
