// The pre-tokenizers' regexes: Hugging Face `tokenizers` compiles them with Oniguruma (Ruby
// syntax); we run them on PCRE2's JIT after translating what the two read differently.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

struct pcre2_real_code_8;

namespace tq::text {

// Oniguruma's pattern as PCRE2 reads it the same way: \s and \S as Oniguruma's Unicode
// whitespace (PCRE2's also takes U+180E), \w and \W as Oniguruma's word characters (PCRE2
// 10.42's leave out marks and connector punctuation), \h and \H as hex digits (PCRE2: horizontal
// space). ^ and $ are line anchors in both (Ruby syntax; PCRE2_MULTILINE).
std::string onig_to_pcre2(std::string_view pattern);

class Regex {
 public:
  // `literal`: the pattern is a plain string (tokenizer.json's {"String": ...}). Error naming
  // `where` if PCRE2 refuses the pattern.
  Regex(const std::string& pattern, bool literal, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every match in text, left to right, as Oniguruma's find_iter gives them (an empty match
  // right after the previous match is skipped). With final = false the text may continue: a
  // match whose extent could depend on what follows is not reported, and the return value is
  // the offset up to which the matches are settled (the end of the last one reported, or the
  // search start). With final = true it returns text.size().
  size_t find_all(std::string_view text, bool final,
                  const std::function<void(size_t start, size_t end)>& on_match) const;
  bool empty_literal() const { return empty_literal_; }

 private:
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
  bool empty_literal_ = false;
};

}  // namespace tq::text
