#include "text/utf8.h"

#include <cstring>

namespace tq::text {
namespace {

// The length of the valid sequence starting at p (n bytes left), 0 if the byte there cannot
// start one, or -k when the k bytes left are a valid but incomplete start. The bounds on the
// second byte are the WHATWG decoder's (no overlongs, surrogates or code points past U+10FFFF).
inline long sequence_at(const unsigned char* p, size_t n, size_t* bad_len) {
  const unsigned char b = p[0];
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    *bad_len = 1;
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (k >= n) return -long(k);  // all present bytes fit: incomplete
    if (p[k] < lo || p[k] > hi) {
      *bad_len = k;  // the maximal subpart: the bytes before the one that does not fit
      return 0;
    }
    lo = 0x80;
    hi = 0xBF;
  }
  return long(need + 1);
}

}  // namespace

size_t valid_utf8_prefix(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // Eight ASCII bytes at a time: most text is mostly ASCII.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    size_t bad = 0;
    const long len = sequence_at(p + i, n - i, &bad);
    if (len <= 0) return i;
    i += size_t(len);
  }
  return n;
}

std::string repair_utf8(std::string_view s, bool final, size_t* held) {
  if (held) *held = 0;
  size_t ok = valid_utf8_prefix(s);
  if (ok == s.size()) return std::string(s);
  std::string out(s.substr(0, ok));
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = ok;
  while (i < n) {
    if (p[i] < 0x80) {
      out.push_back(char(p[i++]));
      continue;
    }
    size_t bad = 0;
    const long len = sequence_at(p + i, n - i, &bad);
    if (len > 0) {
      out.append(s.data() + i, size_t(len));
      i += size_t(len);
    } else if (len < 0) {  // incomplete at the end
      if (!final) {
        if (held) *held = size_t(-len);
        return out;
      }
      out += "\xEF\xBF\xBD";
      i = n;
    } else {
      out += "\xEF\xBF\xBD";
      i += bad;
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

bool is_unicode_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

namespace {
// GPT-2's bytes_to_unicode: the printable ranges ! .. ~, ¡ .. ¬, ® .. ÿ map to themselves, the
// other 68 bytes to U+0100 + their order.
struct ByteLevel {
  std::array<std::string, 256> chars;
  std::array<uint32_t, 256> cps{};
  ByteLevel() {
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      cps[b] = printable ? uint32_t(b) : 256 + n++;
      append_utf8(chars[b], cps[b]);
    }
  }
};
const ByteLevel& byte_level() {
  static const ByteLevel t;
  return t;
}
}  // namespace

const std::array<std::string, 256>& byte_level_chars() {
  return byte_level().chars;
}

int byte_of_char(uint32_t cp) {
  if (cp < 256) {
    const bool printable = (cp >= '!' && cp <= '~') || (cp >= 0xA1 && cp <= 0xAC) || cp >= 0xAE;
    return printable ? int(cp) : -1;
  }
  if (cp >= 256 + 68) return -1;
  const auto& t = byte_level().cps;
  for (int b = 0; b < 256; ++b)
    if (t[b] == cp) return b;
  return -1;
}

}  // namespace tq::text
