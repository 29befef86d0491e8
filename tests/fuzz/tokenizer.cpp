// A tokenizer.json through the loader (every field it reads, every error it names), and when it
// loads, an encode and a decode: a tokenizer, or tq::Error.
#include "text/tokenizer.h"

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/common.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto tok = tq::text::Tokenizer::from_json(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
    const auto ids = tok.encode("Hello, world! It's 2026 \xE4\xBD\xA0\xE5\xA5\xBD <|endoftext|>\n");
    tq::fuzz::sink = unsigned(ids.size() + tok.decode(ids).size() + tok.vocab_size());
  } catch (const tq::Error&) {
  }
  return 0;
}
