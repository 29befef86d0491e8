#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/regex.h"

#include <pcre2.h>

#include "core/common.h"
#include "text/unicode_tables.h"

namespace tq::text {
namespace {

// Oniguruma's Unicode \s: U+0009..U+000D, U+0085 and the separators (Zs, Zl, Zp).
constexpr const char* kSpaceSet =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";
// Oniguruma's Unicode \w: Letter, Mark, Decimal_Number, Connector_Punctuation.
constexpr const char* kWordSet = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
constexpr const char* kHexSet = "0-9a-fA-F";

// Per thread: the match data (one pair: the whole match is all we read) and a JIT stack larger
// than PCRE2's 32 KiB default, which long runs of one character class would overflow.
struct MatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  MatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~MatchState() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};
MatchState& match_state() {
  thread_local MatchState s;
  return s;
}

// \p{L} and \p{N} as the library's Oniguruma (Unicode 16.0) reads them: PCRE2 10.42 has Unicode
// 14.0, so the letters and numbers assigned since are added (text/unicode_tables.h).
std::string with_onig_extra(const char* prop, const CodeRange* begin, const CodeRange* end) {
  std::string s = prop;
  char b[32];
  for (const CodeRange* r = begin; r != end; ++r) {
    std::snprintf(b, sizeof b, "\\x{%X}-\\x{%X}", r->first, r->last);
    s += b;
  }
  return s;
}
const std::string& letters() {
  static const std::string s = with_onig_extra("\\p{L}", std::begin(kOnigLettersAfterUnicode14),
                                               std::end(kOnigLettersAfterUnicode14));
  return s;
}
const std::string& numbers() {
  static const std::string s = with_onig_extra("\\p{N}", std::begin(kOnigNumbersAfterUnicode14),
                                               std::end(kOnigNumbersAfterUnicode14));
  return s;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

std::string shown_pattern(const std::string& p) {
  return p.size() <= 80 ? "'" + p + "'" : "'" + p.substr(0, 77) + "...'";
}

}  // namespace

std::string onig_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 4 < p.size() && (p[i + 1] == 'p' || p[i + 1] == 'P') &&
        (p.substr(i + 2, 3) == "{L}" || p.substr(i + 2, 3) == "{N}")) {
      const std::string& set = p[i + 3] == 'L' ? letters() : numbers();
      const bool negated = p[i + 1] == 'P';
      if (in_class && !negated)
        out += set;
      else if (!in_class)
        out += (negated ? "[^" : "[") + set + "]";
      else
        out.append(p.substr(i, 5));  // \P{L} in a class: PCRE2's own (Unicode 14.0)
      i += 4;
      continue;
    }
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      const char* set = e == 's' || e == 'S'   ? kSpaceSet
                        : e == 'w' || e == 'W' ? kWordSet
                        : e == 'h' || e == 'H' ? kHexSet
                                               : nullptr;
      const bool negated = e == 'S' || e == 'W' || e == 'H';
      if (!set) {
        out += c;
        out += e;
      } else if (!in_class) {
        out += negated ? "[^" : "[";
        out += set;
        out += ']';
      } else if (!negated) {
        out += set;
      } else {
        // A negated set inside a class has no PCRE2 spelling short of set operations; PCRE2's
        // own escape differs only by U+180E (\S), marks (\W) or horizontal space (\H).
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a literal ] first
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(const std::string& pattern, bool literal, const std::string& where) {
  if (literal && pattern.empty()) {
    empty_literal_ = true;
    return;
  }
  const std::string translated = literal ? pattern : onig_to_pcre2(pattern);
  int err = 0;
  PCRE2_SIZE at = 0;
  const uint32_t options =
      PCRE2_UTF | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_MULTILINE);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options,
                        &err, &at, nullptr);
  if (!code_)
    throw Error(where + ": regex " + shown_pattern(pattern) + " is not supported (" +
                pcre2_message(err) + " at offset " + std::to_string(at) + ")");
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD) == 0;
}

Regex::~Regex() {
  pcre2_code_free(code_);
}

size_t Regex::find_all(std::string_view text, bool final,
                       const std::function<void(size_t, size_t)>& on_match) const {
  if (empty_literal_ || text.empty()) return final ? text.size() : 0;
  MatchState& st = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const uint32_t options = PCRE2_NO_UTF_CHECK | (final ? 0 : PCRE2_PARTIAL_HARD);
  size_t pos = 0, settled = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (pos <= text.size()) {
    const int rc =
        jit_ ? pcre2_jit_match(code_, subject, text.size(), pos, options, st.data, st.context)
             : pcre2_match(code_, subject, text.size(), pos, options, st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc == PCRE2_ERROR_PARTIAL) return settled;
    if (rc < 0)
      throw Error("the pre-tokenizer's regex failed on this text (PCRE2: " + pcre2_message(rc) +
                  ")");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t s = ov[0], e = ov[1];
    if (s == e && have_last && last_end == e) {
      // Oniguruma's find_iter: no empty match right after the previous one; step one character.
      if (pos >= text.size()) break;
      size_t step = 1;
      const auto b = static_cast<unsigned char>(text[pos]);
      if (b >= 0xF0)
        step = 4;
      else if (b >= 0xE0)
        step = 3;
      else if (b >= 0xC0)
        step = 2;
      pos += step;
      continue;
    }
    on_match(s, e);
    have_last = true;
    last_end = e;
    settled = e;
    pos = e;
  }
  return final ? text.size() : settled;
}

}  // namespace tq::text
