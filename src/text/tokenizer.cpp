// The tokenizer.json pipeline (text/tokenizer.h), stage by stage as Hugging Face `tokenizers`
// runs it: added tokens, normalizer, pre-tokenizer, BPE, post-processor; and the decoder.
#include "text/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/common.h"
#include "text/regex.h"
#include "text/unicode_tables.h"
#include "text/utf8.h"

namespace tq::text {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Reading the file: every field is checked as it is read, and an unsupported value names its
// field ("pre_tokenizer.pretokenizers[1].type") rather than encoding differently.

struct Reader {
  std::string origin;
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error(origin + ": " + field + ": " + what);
  }
  const json& get(const json& obj, const std::string& field, const char* key) const {
    if (!obj.is_object()) fail(field, "expected an object");
    auto it = obj.find(key);
    if (it == obj.end()) fail(field + "." + key, "missing");
    return *it;
  }
  std::string str(const json& obj, const std::string& field, const char* key) const {
    const json& v = get(obj, field, key);
    if (!v.is_string()) fail(field + "." + key, "expected a string");
    return v.get<std::string>();
  }
  bool flag(const json& obj, const std::string& field, const char* key, bool dflt) const {
    if (!obj.is_object()) fail(field, "expected an object");
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return dflt;
    if (!it->is_boolean()) fail(field + "." + key, "expected true or false");
    return it->get<bool>();
  }
  uint32_t id(const json& v, const std::string& field) const {
    if (!v.is_number_unsigned() || v.get<uint64_t>() > 0x7fffffffu)
      fail(field, "expected a token id (a whole number below 2^31)");
    return v.get<uint32_t>();
  }
};

// ---------------------------------------------------------------------------------------------
// Normalizers

struct Normalizer {
  enum Kind { NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip } kind;
  std::string text;                // Prepend's text, Replace's content
  std::shared_ptr<Regex> pattern;  // Replace's
  bool left = false, right = false;

  void apply(std::string& s) const {
    switch (kind) {
      case NFC:
      case NFD:
      case NFKC:
      case NFKD: {
        // ASCII is in every normal form; most text is ASCII and skips utf8proc.
        if (valid_ascii(s)) return;
        // The library normalizes with Unicode 9.0 data: a character assigned since that takes
        // part in normalization is, to it, an unassigned starter, which nothing composes or
        // reorders across. So the runs between such characters are normalized apart.
        std::string out;
        size_t run = 0;
        for (size_t i = 0; i < s.size();) {
          const size_t at = i;
          if (static_cast<unsigned char>(s[i]) < 0x80) {
            ++i;
            continue;
          }
          if (!after_unicode9(next_code_point(s, i))) continue;
          out += normal_form(std::string_view(s).substr(run, at - run));
          out.append(s, at, i - at);
          run = i;
        }
        if (run == 0) {
          s = normal_form(s);
        } else {
          out += normal_form(std::string_view(s).substr(run));
          s = std::move(out);
        }
        return;
      }
      case Prepend:
        if (!s.empty()) s.insert(0, text);
        return;
      case Strip: {
        size_t b = 0, e = s.size();
        if (left)
          while (b < e) {
            size_t i = b;
            if (!is_unicode_space(next_code_point(s, i))) break;
            b = i;
          }
        if (right)
          while (e > b) {
            size_t st = e - 1;
            while (st > b && (static_cast<unsigned char>(s[st]) & 0xC0) == 0x80) --st;
            size_t i = st;
            if (!is_unicode_space(next_code_point(s, i))) break;
            e = st;
          }
        s = s.substr(b, e - b);
        return;
      }
      case Replace: {
        std::string out;
        size_t prev = 0;
        pattern->find_all(s, true, [&](size_t a, size_t b) {
          out.append(s, prev, a - prev);
          out += text;
          prev = b;
        });
        out.append(s, prev, std::string::npos);
        s = std::move(out);
        return;
      }
    }
  }
  std::string normal_form(std::string_view s) const {
    if (s.empty()) return {};
    int opts = UTF8PROC_STABLE;
    if (kind == NFC || kind == NFKC) opts |= UTF8PROC_COMPOSE;
    if (kind == NFD || kind == NFKD) opts |= UTF8PROC_DECOMPOSE;
    if (kind == NFKC || kind == NFKD) opts |= UTF8PROC_COMPAT;
    utf8proc_uint8_t* out = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                     utf8proc_ssize_t(s.size()), &out, utf8proc_option_t(opts));
    if (n < 0) throw Error(std::string("Unicode normalization failed: ") + utf8proc_errmsg(n));
    std::string r(reinterpret_cast<const char*>(out), size_t(n));
    std::free(out);
    return r;
  }
  static bool after_unicode9(uint32_t cp) {
    const auto& t = kNormalizationAfterUnicode9;
    if (cp < t[0].first) return false;
    const auto* it = std::upper_bound(std::begin(t), std::end(t), cp,
                                      [](uint32_t c, const CodeRange& r) { return c < r.first; });
    return it != std::begin(t) && cp <= (it - 1)->last;
  }
  static bool valid_ascii(const std::string& s) {
    for (unsigned char c : s)
      if (c >= 0x80) return false;
    return true;
  }
};

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers: a Sequence is kept flat, each stage applied to every piece of the previous.

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct Stage {
  enum Kind { Split, ByteLevel } kind;
  std::shared_ptr<Regex> regex;  // Split's pattern; ByteLevel's GPT-2 pattern when use_regex
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false;
};

// GPT-2's pattern, which ByteLevel splits on when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A piece on its way to the model: `bytes` marks that ByteLevel has mapped it (each byte stands
// for its byte-level character, which the BPE model looks up without building the string).
struct Piece {
  std::string_view text;
  bool bytes = false;
};

// ---------------------------------------------------------------------------------------------
// The BPE model

// (left id, right id) -> (rank, merged id), open addressing: the merge loop's one lookup.
class MergeTable {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, {0, 0});
    mask_ = cap - 1;
  }
  // false if the pair is already there (the first rank stays, as in the library's map)
  void put(uint32_t a, uint32_t b, uint32_t rank, uint32_t id) {
    const uint64_t k = key(a, b);
    size_t i = hash(k) & mask_;
    while (keys_[i] != kEmpty) {
      if (keys_[i] == k) {
        vals_[i] = {rank, id};  // a later duplicate wins, as HashMap::insert does
        return;
      }
      i = (i + 1) & mask_;
    }
    keys_[i] = k;
    vals_[i] = {rank, id};
  }
  // rank and id, or false
  bool get(uint32_t a, uint32_t b, uint32_t* rank, uint32_t* id) const {
    if (keys_.empty()) return false;
    const uint64_t k = key(a, b);
    size_t i = hash(k) & mask_;
    while (keys_[i] != kEmpty) {
      if (keys_[i] == k) {
        *rank = vals_[i].first;
        *id = vals_[i].second;
        return true;
      }
      i = (i + 1) & mask_;
    }
    return false;
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t key(uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; }
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return size_t(k);
  }
  std::vector<uint64_t> keys_;
  std::vector<std::pair<uint32_t, uint32_t>> vals_;
  size_t mask_ = 0;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>>;

struct Bpe {
  Vocab vocab;
  MergeTable merges;
  std::optional<uint32_t> unk;
  std::string prefix, suffix;  // continuing_subword_prefix, end_of_word_suffix
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  int32_t byte_ids[256];      // the id of each byte's byte-level character, or -1
  int32_t fallback_ids[256];  // <0xXX>, or -1

  // One word's symbols merged as the library's Word::merge_all does: the lowest rank first,
  // the leftmost on a tie, one occurrence at a time.
  struct Symbol {
    uint32_t id;
    int32_t prev, next;
    uint32_t len;
  };
  struct Pending {
    uint32_t rank, pos, id;
    bool operator<(const Pending& o) const {  // a max-heap on this pops the lowest rank, pos
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  void merge_all(std::vector<Symbol>& sym, std::vector<Pending>& heap) const {
    heap.clear();
    uint32_t rank, id;
    for (size_t i = 0; i + 1 < sym.size(); ++i)
      if (merges.get(sym[i].id, sym[i + 1].id, &rank, &id)) heap.push_back({rank, uint32_t(i), id});
    std::make_heap(heap.begin(), heap.end());
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end());
      const Pending top = heap.back();
      heap.pop_back();
      Symbol& cur = sym[top.pos];
      if (cur.len == 0 || cur.next == -1) continue;
      Symbol& right = sym[size_t(cur.next)];
      // an entry for a pair that has changed since it was queued
      if (!merges.get(cur.id, right.id, &rank, &id) || id != top.id) continue;
      cur.id = top.id;
      cur.len += right.len;
      cur.next = right.next;
      right.len = 0;
      if (cur.next >= 0) sym[size_t(cur.next)].prev = int32_t(top.pos);
      if (cur.prev >= 0 && merges.get(sym[size_t(cur.prev)].id, cur.id, &rank, &id)) {
        heap.push_back({rank, uint32_t(cur.prev), id});
        std::push_heap(heap.begin(), heap.end());
      }
      if (cur.next >= 0 && merges.get(cur.id, sym[size_t(cur.next)].id, &rank, &id)) {
        heap.push_back({rank, top.pos, id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }

  // The word's initial symbols, as the library's merge_word builds them: each character (or,
  // for a byte-level piece, each byte's character) looked up; if absent, its <0xXX> bytes with
  // byte_fallback, else the unknown token (fused if fuse_unk), else dropped.
  void initial_symbols(const Piece& w, std::vector<Symbol>& sym) const {
    sym.clear();
    const std::string_view t = w.text;
    if (w.bytes && prefix.empty() && suffix.empty()) {
      bool all = true;
      for (unsigned char b : t) all &= byte_ids[b] >= 0;
      if (all) {
        for (size_t i = 0; i < t.size(); ++i)
          sym.push_back({uint32_t(byte_ids[static_cast<unsigned char>(t[i])]), int32_t(i) - 1,
                         i + 1 < t.size() ? int32_t(i + 1) : -1, 1});
        return;
      }
    }
    bool unk_pending = false;  // an unknown token waiting (fuse_unk lengthens it)
    uint32_t unk_len = 0;
    auto add = [&](uint32_t id, uint32_t len) {
      sym.push_back({id, int32_t(sym.size()) - 1, -1, len});
      if (sym.size() > 1) sym[sym.size() - 2].next = int32_t(sym.size() - 1);
    };
    std::string unit;
    size_t i = 0;
    while (i < t.size()) {
      const size_t start = i;
      unit.clear();
      uint32_t byte_len;
      if (w.bytes) {  // one byte, seen as its byte-level character
        unit = byte_level_chars()[static_cast<unsigned char>(t[i])];
        i += 1;
        byte_len = uint32_t(unit.size());
      } else {
        next_code_point(t, i);
        unit.assign(t.substr(start, i - start));
        byte_len = uint32_t(i - start);
      }
      if (start > 0 && !prefix.empty()) unit.insert(0, prefix);
      if (i >= t.size() && !suffix.empty()) unit += suffix;
      auto it = vocab.find(std::string_view(unit));
      if (it != vocab.end()) {
        if (unk_pending) {
          add(*unk, unk_len);
          unk_pending = false;
        }
        add(it->second, byte_len);
        continue;
      }
      if (byte_fallback) {
        bool all = true;
        for (unsigned char b : unit) all &= fallback_ids[b] >= 0;
        if (all) {
          for (unsigned char b : unit) add(uint32_t(fallback_ids[b]), 1);
          continue;
        }
      }
      if (unk) {
        if (unk_pending && fuse_unk) {
          unk_len += byte_len;
        } else {
          if (unk_pending) add(*unk, unk_len);
          unk_pending = true;
          unk_len = byte_len;
        }
      }
    }
    if (unk_pending) add(*unk, unk_len);
  }

  void encode_word(const Piece& w, std::vector<uint32_t>& out, std::vector<Symbol>& sym,
                   std::vector<Pending>& heap) const {
    if (ignore_merges) {
      std::string mapped;
      std::string_view whole = w.text;
      if (w.bytes) {
        for (unsigned char b : w.text) mapped += byte_level_chars()[b];
        whole = mapped;
      }
      auto it = vocab.find(whole);
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    initial_symbols(w, sym);
    if (sym.size() > 1) merge_all(sym, heap);
    for (const Symbol& s : sym)
      if (s.len != 0) out.push_back(s.id);
  }
};

// Words already merged, per thread and tokenizer: natural text repeats its words, and a lookup
// is far cheaper than a merge. Results do not depend on it.
struct WordCache {
  uint64_t owner = 0;
  // [0]: pieces of text, [1]: pieces of bytes (byte-level)
  std::unordered_map<std::string, std::vector<uint32_t>, StringHash, std::equal_to<>> map[2];
  std::vector<Bpe::Symbol> sym;
  std::vector<Bpe::Pending> heap;
};
constexpr size_t kCacheWords = 1 << 17;
constexpr size_t kCacheWordBytes = 256;  // longer words are not kept

std::atomic<uint64_t> next_owner{1};

// ---------------------------------------------------------------------------------------------
// Added tokens

struct AddedToken {
  std::string content;
  uint32_t id;
  bool special, normalized, lstrip, rstrip, single_word;
};

struct Match {
  size_t start, end;
  uint32_t id;
};

// Leftmost-longest matching of a set of strings (what the library's Aho-Corasick automaton
// finds), then the tokens' single_word, lstrip and rstrip rules as its find_matches applies them.
class AddedMatcher {
 public:
  void build(std::vector<const AddedToken*> toks) {
    tokens_ = std::move(toks);
    std::sort(tokens_.begin(), tokens_.end(), [](const AddedToken* a, const AddedToken* b) {
      return a->content.size() > b->content.size();
    });
    for (auto& f : first_) f.clear();
    max_len_ = 0;
    for (const AddedToken* t : tokens_) {
      if (t->content.empty()) continue;
      first_[static_cast<unsigned char>(t->content[0])].push_back(t);
      max_len_ = std::max(max_len_, t->content.size());
    }
  }
  bool empty() const { return max_len_ == 0; }
  size_t max_len() const { return max_len_; }
  bool has_rules() const {
    for (const AddedToken* t : tokens_)
      if (t->lstrip || t->rstrip || t->single_word) return true;
    return false;
  }

  // The raw leftmost-longest occurrences, non-overlapping.
  void occurrences(std::string_view s, std::vector<Match>& out) const {
    out.clear();
    if (empty()) return;
    size_t i = 0;
    while (i < s.size()) {
      const auto& cands = first_[static_cast<unsigned char>(s[i])];
      const AddedToken* hit = nullptr;
      for (const AddedToken* t : cands)  // longest first
        if (s.compare(i, t->content.size(), t->content) == 0) {
          hit = t;
          break;
        }
      if (hit) {
        out.push_back({i, i + hit->content.size(), hit->id});
        i += hit->content.size();
      } else {
        ++i;
      }
    }
  }

  // The library's find_matches: the occurrences after single_word, lstrip and rstrip.
  void matches(std::string_view s, std::vector<Match>& out) const {
    std::vector<Match> occ;
    occurrences(s, occ);
    out.clear();
    size_t start_offset = 0;
    for (const Match& m : occ) {
      const AddedToken* t = by_id(m.id);
      size_t start = m.start, stop = m.end;
      if (t->single_word) {
        const bool start_space = start == 0 || !ends_with_word(s.substr(0, start));
        const bool stop_space = stop == s.size() || !starts_with_word(s.substr(stop));
        if (!start_space || !stop_space) continue;
      }
      if (t->lstrip) {
        size_t ns = start;
        while (ns > 0) {
          size_t b = ns - 1;
          while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
          size_t k = b;
          if (!is_unicode_space(next_code_point(s, k))) break;
          ns = b;
        }
        start = std::max(ns, start_offset);
      }
      if (t->rstrip) {
        while (stop < s.size()) {
          size_t k = stop;
          if (!is_unicode_space(next_code_point(s, k))) break;
          stop = k;
        }
      }
      out.push_back({start, stop, m.id});
      start_offset = stop;
    }
  }

 private:
  const AddedToken* by_id(uint32_t id) const {
    for (const AddedToken* t : tokens_)
      if (t->id == id) return t;
    return nullptr;
  }
  // Rust regex's \w (Unicode word character) before the end / after the start
  static bool is_word(uint32_t cp) {
    static const Regex w("^[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]$", false,
                         "added tokens");
    std::string one;
    append_utf8(one, cp);
    bool hit = false;
    w.find_all(one, true, [&](size_t, size_t) { hit = true; });
    return hit;
  }
  static bool ends_with_word(std::string_view s) {
    if (s.empty()) return false;
    size_t b = s.size() - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
    return is_word(next_code_point(s, b));
  }
  static bool starts_with_word(std::string_view s) {
    if (s.empty()) return false;
    size_t i = 0;
    return is_word(next_code_point(s, i));
  }

  std::vector<const AddedToken*> tokens_;
  std::array<std::vector<const AddedToken*>, 256> first_;
  size_t max_len_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------------

struct TokenizerImpl {
  uint64_t owner = next_owner++;
  std::vector<Normalizer> normalizers;
  std::vector<Stage> stages;
  Bpe bpe;
  std::vector<AddedToken> added;
  AddedMatcher raw_added, normalized_added;  // matched before / after normalization
  std::vector<std::string> id_to_token;      // "" where no token
  std::vector<uint8_t> has_id, special;
  std::vector<uint32_t> prefix_ids, suffix_ids;  // the post-processor's, for one sequence
  enum class Decoder { None, ByteLevel } decoder = Decoder::None;
  bool streamable = true;

  WordCache& cache() const {
    thread_local WordCache c;
    if (c.owner != owner) {
      c.map[0].clear();
      c.map[1].clear();
      c.owner = owner;
    }
    return c;
  }

  void normalize(std::string& s) const {
    for (const Normalizer& n : normalizers) n.apply(s);
  }

  void encode_piece(const Piece& p, std::vector<uint32_t>& out) const {
    if (p.text.empty()) return;
    WordCache& c = cache();
    auto& map = c.map[p.bytes];
    auto it = map.find(p.text);
    if (it != map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
    const size_t at = out.size();
    bpe.encode_word(p, out, c.sym, c.heap);
    if (p.text.size() <= kCacheWordBytes) {
      if (map.size() >= kCacheWords) map.clear();
      map.emplace(std::string(p.text), std::vector<uint32_t>(out.begin() + long(at), out.end()));
    }
  }

  // Applies stages[k..] to one piece; `arena` owns the strings that stages build.
  // Applies stages[k..] to one piece and hands each final piece to done(Piece); `arena` owns
  // the strings that stages build. Encoding and pre_tokenize() both walk the stages here.
  template <class Done>
  void run_stages(size_t k, Piece p, std::deque<std::string>& arena, Done&& done) const {
    if (p.text.empty()) return;
    if (k == stages.size()) {
      done(p);
      return;
    }
    const Stage& st = stages[k];
    if (st.kind == Stage::ByteLevel) {
      if (st.add_prefix_space && p.text[0] != ' ') {
        arena.push_back(" " + std::string(p.text));
        p.text = arena.back();
      }
      if (!st.regex) {
        run_stages(k + 1, {p.text, true}, arena, done);
        return;
      }
      if (p.bytes) p = {materialize(p, arena), false};
      split(*st.regex, Behavior::Isolated, false, p.text, true, [&](std::string_view piece) {
        run_stages(k + 1, {piece, true}, arena, done);
      });
      return;
    }
    if (p.bytes) p = {materialize(p, arena), false};
    split(*st.regex, st.behavior, st.invert, p.text, true, [&](std::string_view piece) {
      run_stages(k + 1, {piece, false}, arena, done);
    });
  }
  void run_stages(size_t k, Piece p, std::deque<std::string>& arena,
                  std::vector<uint32_t>& out) const {
    run_stages(k, p, arena, [&](const Piece& w) { encode_piece(w, out); });
  }

  static std::string_view materialize(const Piece& p, std::deque<std::string>& arena) {
    std::string m;
    for (unsigned char b : p.text) m += byte_level_chars()[b];
    arena.push_back(std::move(m));
    return arena.back();
  }

  // The library's NormalizedString::split on a regex's matches with a behaviour; empty pieces
  // are dropped (as PreTokenizedString::split drops them). With final = false (Isolated or
  // Removed, not inverted: what `streamable` allows) only settled pieces are emitted and the
  // return value is where the unsettled rest starts.
  template <class Emit>
  static size_t split(const Regex& re, Behavior behavior, bool invert, std::string_view s,
                      bool final, Emit&& emit) {
    if (s.empty()) return 0;
    if (!invert && (behavior == Behavior::Isolated || behavior == Behavior::Removed)) {
      size_t prev = 0;
      const size_t settled = re.find_all(s, final, [&](size_t a, size_t b) {
        if (prev != a) emit(s.substr(prev, a - prev));
        if (behavior == Behavior::Isolated && a != b) emit(s.substr(a, b - a));
        prev = b;
      });
      if (final && prev != s.size()) emit(s.substr(prev));
      return final ? s.size() : settled;
    }
    // (offsets, is_match) as Pattern::find_matches gives them, then the behaviour's folding.
    std::vector<std::tuple<size_t, size_t, bool>> m;
    size_t prev = 0;
    re.find_all(s, true, [&](size_t a, size_t b) {
      if (prev != a) m.emplace_back(prev, a, false);
      m.emplace_back(a, b, true);
      prev = b;
    });
    if (prev != s.size()) m.emplace_back(prev, s.size(), false);
    if (invert)
      for (auto& t : m) std::get<2>(t) = !std::get<2>(t);
    std::vector<std::pair<size_t, size_t>> out;
    switch (behavior) {
      case Behavior::Isolated:
        for (auto& [a, b, is] : m) out.emplace_back(a, b);
        break;
      case Behavior::Removed:
        for (auto& [a, b, is] : m)
          if (!is) out.emplace_back(a, b);
        break;
      case Behavior::Contiguous: {
        bool prev_match = false;
        for (auto& [a, b, is] : m) {
          if (is == prev_match && !out.empty())
            out.back().second = b;
          else
            out.emplace_back(a, b);
          prev_match = is;
        }
        break;
      }
      case Behavior::MergedWithPrevious: {
        bool prev_match = false;
        for (auto& [a, b, is] : m) {
          if (is && !prev_match && !out.empty())
            out.back().second = b;
          else
            out.emplace_back(a, b);
          prev_match = is;
        }
        break;
      }
      case Behavior::MergedWithNext: {
        bool prev_match = false;
        for (auto r = m.rbegin(); r != m.rend(); ++r) {
          auto& [a, b, is] = *r;
          if (is && !prev_match && !out.empty())
            out.back().first = a;
          else
            out.emplace_back(a, b);
          prev_match = is;
        }
        std::reverse(out.begin(), out.end());
        break;
      }
    }
    for (auto& [a, b] : out)
      if (a != b) emit(s.substr(a, b - a));
    return s.size();
  }

  // Pre-tokenizes and encodes normalized text of one segment (between added tokens). With
  // final = false, returns how much of it is settled and encoded (the caller keeps the rest).
  size_t encode_normalized(std::string_view s, bool final, std::vector<uint32_t>& out) const {
    if (s.empty()) return 0;
    std::deque<std::string> arena;
    if (stages.empty()) {
      if (!final) return 0;
      encode_piece({s, false}, out);
      return s.size();
    }
    if (final) {
      run_stages(0, {s, false}, arena, out);
      return s.size();
    }
    // Streaming (`streamable`): only the first stage sees the unfinished text.
    const Stage& st = stages[0];
    if (!st.regex) return 0;  // a ByteLevel stage without its regex: one piece, unsettled
    const bool bytes = st.kind == Stage::ByteLevel;
    return split(*st.regex, st.kind == Stage::ByteLevel ? Behavior::Isolated : st.behavior, false,
                 s, false, [&](std::string_view piece) {
                   run_stages(1, {piece, bytes}, arena, out);
                 });
  }

  // A segment of raw (valid UTF-8) text between non-normalized added tokens, final.
  void encode_segment(std::string_view raw, std::vector<uint32_t>& out) const {
    if (raw.empty()) return;
    std::string norm;
    std::string_view text = raw;
    if (!normalizers.empty()) {
      norm.assign(raw);
      normalize(norm);
      text = norm;
    }
    if (normalized_added.empty()) {
      encode_normalized(text, true, out);
      return;
    }
    std::vector<Match> ms;
    normalized_added.matches(text, ms);
    size_t prev = 0;
    for (const Match& m : ms) {
      encode_normalized(text.substr(prev, m.start - prev), true, out);
      out.push_back(m.id);
      prev = m.end;
    }
    encode_normalized(text.substr(prev), true, out);
  }

  // Valid UTF-8 text, whole: the added-token split, then each segment.
  void encode_valid(std::string_view s, std::vector<uint32_t>& out) const {
    if (raw_added.empty()) {
      encode_segment(s, out);
      return;
    }
    std::vector<Match> ms;
    raw_added.matches(s, ms);
    size_t prev = 0;
    for (const Match& m : ms) {
      encode_segment(s.substr(prev, m.start - prev), out);
      out.push_back(m.id);
      prev = m.end;
    }
    encode_segment(s.substr(prev), out);
  }

  void post_process(std::vector<uint32_t>& ids, size_t from) const {
    if (!prefix_ids.empty())
      ids.insert(ids.begin() + long(from), prefix_ids.begin(), prefix_ids.end());
    ids.insert(ids.end(), suffix_ids.begin(), suffix_ids.end());
  }

  // ---- loading ----

  void load_normalizer(const Reader& r, const json& j, const std::string& f) {
    if (j.is_null()) return;
    const std::string type = r.str(j, f, "type");
    if (type == "Sequence") {
      const json& list = r.get(j, f, "normalizers");
      if (!list.is_array()) r.fail(f + ".normalizers", "expected a list");
      for (size_t i = 0; i < list.size(); ++i)
        load_normalizer(r, list[i], f + ".normalizers[" + std::to_string(i) + "]");
      return;
    }
    Normalizer n{Normalizer::NFC, {}, nullptr};
    if (type == "NFC")
      n.kind = Normalizer::NFC;
    else if (type == "NFD")
      n.kind = Normalizer::NFD;
    else if (type == "NFKC")
      n.kind = Normalizer::NFKC;
    else if (type == "NFKD")
      n.kind = Normalizer::NFKD;
    else if (type == "Prepend") {
      n.kind = Normalizer::Prepend;
      n.text = r.str(j, f, "prepend");
      streamable = false;
    } else if (type == "Strip") {
      n.kind = Normalizer::Strip;
      n.left = r.flag(j, f, "strip_left", false);
      n.right = r.flag(j, f, "strip_right", false);
      streamable = false;
    } else if (type == "Replace") {
      n.kind = Normalizer::Replace;
      n.text = r.str(j, f, "content");
      n.pattern = load_pattern(r, r.get(j, f, "pattern"), f + ".pattern");
      streamable = false;
    } else {
      r.fail(f + ".type", "'" + type +
                              "' is not supported (supported: NFC, NFD, NFKC, NFKD, Prepend, "
                              "Strip, Replace, Sequence)");
    }
    normalizers.push_back(std::move(n));
  }

  static std::shared_ptr<Regex> load_pattern(const Reader& r, const json& j, const std::string& f) {
    if (j.is_object() && j.size() == 1 && j.contains("Regex") && j["Regex"].is_string())
      return std::make_shared<Regex>(j["Regex"].get<std::string>(), false, r.origin + ": " + f);
    if (j.is_object() && j.size() == 1 && j.contains("String") && j["String"].is_string())
      return std::make_shared<Regex>(j["String"].get<std::string>(), true, r.origin + ": " + f);
    r.fail(f, "expected {\"Regex\": ...} or {\"String\": ...}");
  }

  void load_pre_tokenizer(const Reader& r, const json& j, const std::string& f) {
    if (j.is_null()) return;
    const std::string type = r.str(j, f, "type");
    if (type == "Sequence") {
      const json& list = r.get(j, f, "pretokenizers");
      if (!list.is_array()) r.fail(f + ".pretokenizers", "expected a list");
      for (size_t i = 0; i < list.size(); ++i)
        load_pre_tokenizer(r, list[i], f + ".pretokenizers[" + std::to_string(i) + "]");
      return;
    }
    Stage st{Stage::Split, nullptr};
    if (type == "Split") {
      st.regex = load_pattern(r, r.get(j, f, "pattern"), f + ".pattern");
      const std::string b = r.str(j, f, "behavior");
      if (b == "Removed")
        st.behavior = Behavior::Removed;
      else if (b == "Isolated")
        st.behavior = Behavior::Isolated;
      else if (b == "MergedWithPrevious")
        st.behavior = Behavior::MergedWithPrevious;
      else if (b == "MergedWithNext")
        st.behavior = Behavior::MergedWithNext;
      else if (b == "Contiguous")
        st.behavior = Behavior::Contiguous;
      else
        r.fail(f + ".behavior", "'" + b + "' is not a split behaviour");
      st.invert = r.flag(j, f, "invert", false);
      if (stages.empty() &&
          (st.invert || (st.behavior != Behavior::Isolated && st.behavior != Behavior::Removed)))
        streamable = false;
      if (st.regex->empty_literal()) streamable = false;
    } else if (type == "ByteLevel") {
      st.kind = Stage::ByteLevel;
      st.add_prefix_space = r.flag(j, f, "add_prefix_space", true);
      if (r.flag(j, f, "use_regex", true))
        st.regex = std::make_shared<Regex>(kGpt2Pattern, false, "ByteLevel");
      if (stages.empty() && st.add_prefix_space) streamable = false;
    } else {
      r.fail(f + ".type",
             "'" + type + "' is not supported (supported: Split, ByteLevel, Sequence)");
    }
    stages.push_back(std::move(st));
  }

  void load_model(const Reader& r, const json& m) {
    const std::string f = "model";
    if (!m.is_object()) r.fail(f, "expected an object");
    if (m.contains("type") && r.str(m, f, "type") != "BPE")
      r.fail(f + ".type", "'" + r.str(m, f, "type") + "' is not supported (only BPE)");
    if (m.contains("dropout") && !m["dropout"].is_null() &&
        !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0))
      r.fail(f + ".dropout", "BPE dropout is not supported (set it to null)");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      auto it = m.find(k);
      if (it != m.end() && !it->is_null() && !it->is_string())
        r.fail(f + "." + k, "expected a string or null");
    }
    if (m.contains("continuing_subword_prefix") && m["continuing_subword_prefix"].is_string())
      bpe.prefix = m["continuing_subword_prefix"].get<std::string>();
    if (m.contains("end_of_word_suffix") && m["end_of_word_suffix"].is_string())
      bpe.suffix = m["end_of_word_suffix"].get<std::string>();
    bpe.byte_fallback = r.flag(m, f, "byte_fallback", false);
    bpe.fuse_unk = r.flag(m, f, "fuse_unk", false);
    bpe.ignore_merges = r.flag(m, f, "ignore_merges", false);
    const json& vocab = r.get(m, f, "vocab");
    if (!vocab.is_object()) r.fail(f + ".vocab", "expected an object of token: id");
    bpe.vocab.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const json& v = it.value();  // (the field's name is built only for an error)
      const uint32_t id = v.is_number_unsigned() && v.get<uint64_t>() <= 0x7fffffffu
                              ? v.get<uint32_t>()
                              : r.id(v, f + ".vocab[\"" + it.key() + "\"]");
      bpe.vocab.emplace(it.key(), id);
      set_token(id, it.key(), false);
    }
    if (m.contains("unk_token") && !m["unk_token"].is_null()) {
      const std::string u = r.str(m, f, "unk_token");
      auto it = bpe.vocab.find(u);
      if (it == bpe.vocab.end()) r.fail(f + ".unk_token", "'" + u + "' is not in the vocabulary");
      bpe.unk = it->second;
    }
    const json& merges = r.get(m, f, "merges");
    if (!merges.is_array()) r.fail(f + ".merges", "expected a list");
    bpe.merges.reserve(merges.size());
    std::string merged;
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& e = merges[i];
      const auto fi = [&] { return f + ".merges[" + std::to_string(i) + "]"; };
      std::string_view a, b;
      if (e.is_string()) {  // "a b"
        const std::string& s = e.get_ref<const std::string&>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          r.fail(fi(), "expected two tokens separated by one space");
        a = std::string_view(s).substr(0, sp);
        b = std::string_view(s).substr(sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get_ref<const std::string&>();
        b = e[1].get_ref<const std::string&>();
      } else {
        r.fail(fi(), "expected [\"a\", \"b\"] or \"a b\"");
      }
      auto ia = bpe.vocab.find(a), ib = bpe.vocab.find(b);
      if (ia == bpe.vocab.end() || ib == bpe.vocab.end())
        r.fail(fi(),
               "'" + std::string(ia == bpe.vocab.end() ? a : b) + "' is not in the vocabulary");
      merged.assign(a);
      if (!bpe.prefix.empty() && b.substr(0, bpe.prefix.size()) == bpe.prefix)
        b.remove_prefix(bpe.prefix.size());
      merged += b;
      auto im = bpe.vocab.find(std::string_view(merged));
      if (im == bpe.vocab.end())
        r.fail(fi(), "makes '" + merged + "', which is not in the vocabulary");
      bpe.merges.put(ia->second, ib->second, uint32_t(i), im->second);
    }
    for (int b = 0; b < 256; ++b) {
      auto it = bpe.vocab.find(byte_level_chars()[size_t(b)]);
      bpe.byte_ids[b] = it == bpe.vocab.end() ? -1 : int32_t(it->second);
      char code[8];
      std::snprintf(code, sizeof code, "<0x%02X>", b);
      auto fb = bpe.vocab.find(std::string_view(code));
      bpe.fallback_ids[b] = fb == bpe.vocab.end() ? -1 : int32_t(fb->second);
    }
  }

  void set_token(uint32_t id, const std::string& token, bool is_special) {
    if (id >= id_to_token.size()) {
      id_to_token.resize(size_t(id) + 1);
      has_id.resize(size_t(id) + 1, 0);
      special.resize(size_t(id) + 1, 0);
    }
    id_to_token[id] = token;
    has_id[id] = 1;
    if (is_special) special[id] = 1;
  }

  void load_added(const Reader& r, const json& list) {
    if (list.is_null()) return;
    if (!list.is_array()) r.fail("added_tokens", "expected a list");
    added.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      const json& t = list[i];
      const std::string f = "added_tokens[" + std::to_string(i) + "]";
      AddedToken a;
      a.id = r.id(r.get(t, f, "id"), f + ".id");
      a.content = r.str(t, f, "content");
      if (a.content.empty()) r.fail(f + ".content", "empty");
      if (valid_utf8_prefix(a.content) != a.content.size()) r.fail(f + ".content", "not UTF-8");
      a.special = r.flag(t, f, "special", false);
      a.normalized = r.flag(t, f, "normalized", !a.special);
      a.lstrip = r.flag(t, f, "lstrip", false);
      a.rstrip = r.flag(t, f, "rstrip", false);
      a.single_word = r.flag(t, f, "single_word", false);
      added.push_back(std::move(a));
    }
  }

  void finish_added() {
    std::vector<const AddedToken*> raw, norm;
    std::vector<AddedToken> normalized_copies;
    for (const AddedToken& a : added) {
      set_token(a.id, a.content, a.special);
      (a.normalized ? norm : raw).push_back(&a);
    }
    // A normalized token is matched in its normalized form.
    norm_forms.clear();
    norm_forms.reserve(norm.size());
    for (const AddedToken* a : norm) {
      AddedToken c = *a;
      normalize(c.content);
      norm_forms.push_back(std::move(c));
    }
    std::vector<const AddedToken*> np;
    for (const AddedToken& c : norm_forms)
      if (!c.content.empty()) np.push_back(&c);
    raw_added.build(raw);
    normalized_added.build(np);
    if (!normalized_added.empty() || raw_added.has_rules()) streamable = false;
  }
  std::vector<AddedToken> norm_forms;

  uint32_t token_id(const Reader& r, const std::string& f, const std::string& token) const {
    for (const AddedToken& a : added)
      if (a.content == token) return a.id;
    auto it = bpe.vocab.find(token);
    if (it == bpe.vocab.end()) r.fail(f, "'" + token + "' is not a token");
    return it->second;
  }

  // The ids the post-processor puts before and after one sequence.
  void load_post_processor(const Reader& r, const json& j, const std::string& f,
                           std::vector<uint32_t>& pre, std::vector<uint32_t>& post) {
    if (j.is_null()) return;
    const std::string type = r.str(j, f, "type");
    if (type == "ByteLevel") return;  // offsets only
    if (type == "Sequence") {
      const json& list = r.get(j, f, "processors");
      if (!list.is_array()) r.fail(f + ".processors", "expected a list");
      for (size_t i = 0; i < list.size(); ++i) {
        std::vector<uint32_t> p2, s2;
        load_post_processor(r, list[i], f + ".processors[" + std::to_string(i) + "]", p2, s2);
        pre.insert(pre.begin(), p2.begin(), p2.end());
        post.insert(post.end(), s2.begin(), s2.end());
      }
      return;
    }
    if (type == "BertProcessing" || type == "RobertaProcessing") {
      for (const char* k : {"cls", "sep"}) {
        const json& v = r.get(j, f, k);
        if (!v.is_array() || v.size() != 2 || !v[0].is_string())
          r.fail(f + "." + k, "expected [token, id]");
        (std::string(k) == "cls" ? pre : post).push_back(r.id(v[1], f + "." + k + "[1]"));
      }
      return;
    }
    if (type == "TemplateProcessing") {
      const json& single = r.get(j, f, "single");
      const json& specials = r.get(j, f, "special_tokens");
      if (!single.is_array()) r.fail(f + ".single", "expected a list");
      bool seen_a = false;
      for (size_t i = 0; i < single.size(); ++i) {
        const std::string fi = f + ".single[" + std::to_string(i) + "]";
        const json& item = single[i];
        if (item.is_object() && item.contains("Sequence")) {
          const std::string which = r.str(item["Sequence"], fi + ".Sequence", "id");
          if (which != "A" || seen_a) r.fail(fi, "a single-sequence template holds A once");
          seen_a = true;
        } else if (item.is_object() && item.contains("SpecialToken")) {
          const std::string name = r.str(item["SpecialToken"], fi + ".SpecialToken", "id");
          const std::string fs = f + ".special_tokens[\"" + name + "\"]";
          if (!specials.is_object() || !specials.contains(name)) r.fail(fs, "missing");
          const json& ids = r.get(specials[name], fs, "ids");
          if (!ids.is_array()) r.fail(fs + ".ids", "expected a list");
          for (const json& id : ids) (seen_a ? post : pre).push_back(r.id(id, fs + ".ids"));
        } else {
          r.fail(fi, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
        }
      }
      if (!seen_a) r.fail(f + ".single", "has no sequence A");
      return;
    }
    r.fail(f + ".type", "'" + type +
                            "' is not supported (supported: ByteLevel, TemplateProcessing, "
                            "BertProcessing, RobertaProcessing, Sequence)");
  }

  void load_decoder(const Reader& r, const json& j, const std::string& f) {
    if (j.is_null()) return;
    const std::string type = r.str(j, f, "type");
    if (type == "ByteLevel") {
      decoder = Decoder::ByteLevel;
      return;
    }
    if (type == "Sequence") {
      const json& list = r.get(j, f, "decoders");
      if (!list.is_array() || list.size() != 1) r.fail(f + ".decoders", "supported: [ByteLevel]");
      load_decoder(r, list[0], f + ".decoders[0]");
      return;
    }
    r.fail(f + ".type", "'" + type + "' is not supported (supported: ByteLevel)");
  }

  void load(const json& j, const std::string& origin) {
    Reader r{origin};
    if (!j.is_object()) r.fail("(top)", "expected a JSON object (a Hugging Face tokenizer.json)");
    for (const char* k : {"truncation", "padding"}) {
      auto it = j.find(k);
      if (it != j.end() && !it->is_null())
        r.fail(k, "not supported (set it to null: tiny-qwen3 never truncates or pads)");
    }
    load_model(r, r.get(j, "(top)", "model"));
    load_normalizer(r, j.value("normalizer", json()), "normalizer");
    load_pre_tokenizer(r, j.value("pre_tokenizer", json()), "pre_tokenizer");
    load_added(r, j.value("added_tokens", json()));
    finish_added();
    load_post_processor(r, j.value("post_processor", json()), "post_processor", prefix_ids,
                        suffix_ids);
    load_decoder(r, j.value("decoder", json()), "decoder");
    if (!stages.empty() && !stages[0].regex) streamable = false;
  }
};

// ---------------------------------------------------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(std::string_view text, const std::string& origin) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded())
    throw Error(origin + ": not valid JSON (a Hugging Face tokenizer.json was expected)");
  auto impl = std::make_unique<TokenizerImpl>();
  impl->load(j, origin);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open the tokenizer (give a tokenizer.json)");
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(path + ": read failed");
  return from_json(ss.str(), path);
}

void Tokenizer::encode(std::string_view text, std::vector<uint32_t>& out,
                       bool add_special_tokens) const {
  const size_t from = out.size();
  if (valid_utf8_prefix(text) == text.size()) {
    impl_->encode_valid(text, out);
  } else {
    const std::string fixed = repair_utf8(text);
    impl_->encode_valid(fixed, out);
  }
  if (add_special_tokens) impl_->post_process(out, from);
}

void Tokenizer::decode_append(const uint32_t* ids, size_t n, bool skip_special_tokens,
                              std::string& out, bool& first) const {
  const TokenizerImpl& t = *impl_;
  for (size_t k = 0; k < n; ++k) {
    const uint32_t id = ids[k];
    if (id >= t.has_id.size() || !t.has_id[id])
      throw Error("token id " + std::to_string(id) +
                  " is not in the tokenizer's vocabulary (ids 0 to " +
                  std::to_string(t.has_id.size() - 1) + ")");
    if (skip_special_tokens && t.special[id]) continue;
    const std::string& tok = t.id_to_token[id];
    if (t.decoder == TokenizerImpl::Decoder::ByteLevel) {
      // A token whose characters are all byte-level characters is those bytes; any other
      // (an added token such as "<|im_start|>" is both) is its own UTF-8.
      const size_t at = out.size();
      bool all = true;
      for (size_t i = 0; i < tok.size() && all;) {
        const int b = byte_of_char(next_code_point(tok, i));
        if (b < 0)
          all = false;
        else
          out.push_back(char(b));
      }
      if (!all) {
        out.resize(at);
        out += tok;
      }
    } else {
      if (!first) out += ' ';
      out += tok;
    }
    first = false;
  }
}

bool Tokenizer::decodes_bytes() const {
  return impl_->decoder == TokenizerImpl::Decoder::ByteLevel;
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids, bool skip_special_tokens) const {
  std::string out;
  bool first = true;
  decode_append(ids.data(), ids.size(), skip_special_tokens, out, first);
  return decodes_bytes() ? repair_utf8(out) : out;
}

std::string Tokenizer::normalize(std::string_view text) const {
  std::string s = repair_utf8(text);
  if (impl_->normalizers.empty()) return s;
  std::vector<Match> ms;
  impl_->raw_added.matches(s, ms);
  std::string out;
  size_t prev = 0;
  for (const Match& m : ms) {
    std::string seg = s.substr(prev, m.start - prev);
    impl_->normalize(seg);
    out += seg;
    out.append(s, m.start, m.end - m.start);
    prev = m.end;
  }
  std::string seg = s.substr(prev);
  impl_->normalize(seg);
  return out + seg;
}

void Tokenizer::pre_tokenize(std::string_view normalized,
                             const std::function<void(std::string_view)>& emit) const {
  // The pieces as the model sees them: byte-level pieces spelled in their characters.
  std::deque<std::string> arena;
  impl_->run_stages(0, Piece{normalized, false}, arena, [&](const Piece& p) {
    emit(p.bytes ? TokenizerImpl::materialize(p, arena) : p.text);
  });
}

uint32_t Tokenizer::vocab_size() const {
  return uint32_t(impl_->has_id.size());
}

std::optional<uint32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : impl_->added)
    if (a.content == token) return a.id;
  auto it = impl_->bpe.vocab.find(token);
  if (it == impl_->bpe.vocab.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Tokenizer::id_to_token(uint32_t id) const {
  if (id >= impl_->has_id.size() || !impl_->has_id[id]) return std::nullopt;
  return impl_->id_to_token[id];
}

bool Tokenizer::is_special(uint32_t id) const {
  return id < impl_->special.size() && impl_->special[id];
}

std::optional<uint32_t> Tokenizer::end_of_text() const {
  for (const char* t : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"})
    if (auto id = token_to_id(t)) return id;
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Streaming: text is encoded in chunks cut where the result cannot depend on what follows.

StreamEncoder::StreamEncoder(const Tokenizer& tok, Sink sink, bool add_special_tokens,
                             size_t chunk_bytes)
    : tok_(tok),
      sink_(std::move(sink)),
      add_special_(add_special_tokens),
      chunk_(std::max<size_t>(chunk_bytes, 1)) {}

void StreamEncoder::feed(std::string_view bytes) {
  pending_.append(bytes);
  if (pending_.size() >= chunk_ + chunk_ / 2 && tok_.impl_->streamable) flush(false);
}

void StreamEncoder::finish() {
  flush(true);
}

void StreamEncoder::emit(std::vector<uint32_t>& ids) {
  if (!started_) {
    started_ = true;
    if (add_special_)
      ids.insert(ids.begin(), tok_.impl_->prefix_ids.begin(), tok_.impl_->prefix_ids.end());
  }
  if (!ids.empty()) sink_(ids.data(), ids.size());
  ids.clear();
}

// Cuts pending_ at c, encodes [0, c) and keeps what the pre-tokenizer has not settled (in
// normalized form) in carry_. A cut is safe where the next byte is ASCII (it ends any invalid
// UTF-8 run, and no normalization composes it with what precedes) and outside an added token;
// added tokens also stay clear of the last max_len bytes, which a longer token could still claim.
void StreamEncoder::flush(bool final) {
  const TokenizerImpl& t = *tok_.impl_;
  std::vector<uint32_t> ids;
  size_t c = pending_.size();
  if (!final) {
    const size_t reserve = t.raw_added.max_len();
    if (pending_.size() <= chunk_ + reserve) return;
    c = pending_.size() - reserve;
    std::vector<Match> occ;
    t.raw_added.occurrences(pending_, occ);
    for (;;) {
      while (c > 0 && static_cast<unsigned char>(pending_[c]) >= 0x80) --c;
      bool moved = false;
      for (const Match& m : occ)
        if (m.start < c && c < m.end) {
          c = m.start;
          moved = true;
        }
      if (!moved) break;
    }
    if (c == 0) return;  // no safe cut yet: keep reading
  }
  const std::string chunk = repair_utf8(std::string_view(pending_).substr(0, c));
  pending_.erase(0, c);
  if (!t.streamable) {  // held whole (final): encoded as Tokenizer::encode does
    t.encode_valid(chunk, ids);
    if (add_special_) {
      started_ = true;
      t.post_process(ids, 0);
    }
    emit(ids);
    return;
  }
  std::vector<Match> ms;
  t.raw_added.matches(chunk, ms);
  size_t prev = 0;
  auto text = [&](std::string_view raw, bool seg_final) {
    std::string norm(raw);
    t.normalize(norm);
    carry_ += norm;
    const size_t done = t.encode_normalized(carry_, seg_final, ids);
    carry_.erase(0, seg_final ? carry_.size() : done);
  };
  for (const Match& m : ms) {
    text(std::string_view(chunk).substr(prev, m.start - prev), true);
    ids.push_back(m.id);
    prev = m.end;
  }
  text(std::string_view(chunk).substr(prev), final);
  if (final && add_special_) {
    if (!started_) {
      started_ = true;
      ids.insert(ids.begin(), t.prefix_ids.begin(), t.prefix_ids.end());
    }
    ids.insert(ids.end(), t.suffix_ids.begin(), t.suffix_ids.end());
  }
  emit(ids);
}

}  // namespace tq::text
