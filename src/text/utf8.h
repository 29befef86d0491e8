// UTF-8 for the tokenizer: validation with Python's errors="replace" repair, the byte-level
// alphabet (GPT-2's bytes_to_unicode), Unicode whitespace as Hugging Face's regexes see it.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tq::text {

// The length of the longest prefix of s that is valid UTF-8.
size_t valid_utf8_prefix(std::string_view s);

// s with each maximal invalid subsequence replaced by U+FFFD: what Python's
// bytes.decode("utf-8", errors="replace"), Rust's String::from_utf8_lossy and the WHATWG
// decoder (Node's Buffer.toString) all give. If final is false, an incomplete sequence at the
// end is not replaced: its length is stored in *held and it is left out of the result.
std::string repair_utf8(std::string_view s, bool final = true, size_t* held = nullptr);

// Decodes the code point at s[i] (valid UTF-8) and advances i.
inline uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  if (p[0] < 0x80) {
    i += 1;
    return p[0];
  }
  if (p[0] < 0xE0) {
    i += 2;
    return (uint32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
  }
  if (p[0] < 0xF0) {
    i += 3;
    return (uint32_t(p[0] & 0x0F) << 12) | (uint32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
  }
  i += 4;
  return (uint32_t(p[0] & 0x07) << 18) | (uint32_t(p[1] & 0x3F) << 12) |
         (uint32_t(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}
void append_utf8(std::string& out, uint32_t cp);

// Unicode White_Space (what Rust's char::is_whitespace and Oniguruma's \s match).
bool is_unicode_space(uint32_t cp);

// GPT-2's byte-level alphabet: byte b is the character byte_char(b) (printable bytes stand for
// themselves, the others are U+0100 and up), here as its UTF-8.
const std::array<std::string, 256>& byte_level_chars();
// The byte a byte-level character stands for, or -1.
int byte_of_char(uint32_t cp);

}  // namespace tq::text
