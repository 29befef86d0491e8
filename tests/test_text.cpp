// The tokenizer library against hand-worked cases of Hugging Face `tokenizers`' rules. The
// comparison with the library itself, on Qwen3's real tokenizer.json, is tests/text/parity.sh.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "core/common.h"
#include "text/bpe_train.h"
#include "text/regex.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace tq::text {
namespace {

using json = nlohmann::json;
using Ids = std::vector<uint32_t>;

// A byte-level tokenizer whose byte b has id b, with these merges (ids from 256 in order).
json byte_level_json(const std::vector<std::pair<std::string, std::string>>& merges,
                     json pre_tokenizer = nullptr) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_chars()[size_t(b)]] = b;
  json m = json::array();
  uint32_t next = 256;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    m.push_back({a, b});
  }
  if (pre_tokenizer.is_null())
    pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
          {"pre_tokenizer", pre_tokenizer},
          {"decoder", {{"type", "ByteLevel"}}}};
}
Tokenizer make(const json& j) {
  return Tokenizer::from_json(j.dump(), "test.json");
}
Ids bytes(const std::string& s) {
  return Ids(s.begin(), s.end());
}

TEST(Utf8, RepairIsPythonsReplace) {
  // Python: b.decode("utf-8", errors="replace"), each maximal invalid subsequence one U+FFFD
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(repair_utf8("\xFF"), R);
  EXPECT_EQ(repair_utf8("\xE0\x80"), R + R);
  EXPECT_EQ(repair_utf8("\xE2\x82"), R);              // a truncated sequence at the end: one
  EXPECT_EQ(repair_utf8("\xED\xA0\x80"), R + R + R);  // a surrogate
  EXPECT_EQ(repair_utf8("\xF0\x9F\x98x"), R + "x");
  EXPECT_EQ(repair_utf8("\xC0\x80"), R + R);  // overlong
  EXPECT_EQ(repair_utf8("a\xF4\x90\x80\x80"
                        "b"),
            "a" + R + R + R + R + "b");  // past U+10FFFF
  EXPECT_EQ(repair_utf8("caf\xC3\xA9 \xF0\x9F\x98\x80"), "caf\xC3\xA9 \xF0\x9F\x98\x80");
  size_t held = 0;
  EXPECT_EQ(repair_utf8("ab\xF0\x9F", false, &held), "ab");
  EXPECT_EQ(held, 2u);
  EXPECT_EQ(valid_utf8_prefix("abc\xC3\xA9\xFF"), 5u);
}

TEST(Utf8, ByteLevelAlphabetIsGpt2s) {
  const auto& c = byte_level_chars();
  EXPECT_EQ(c[' '], "\xC4\xA0");   // Ġ U+0120
  EXPECT_EQ(c['\n'], "\xC4\x8A");  // Ċ U+010A
  EXPECT_EQ(c['A'], "A");
  EXPECT_EQ(c[0xAD], "\xC5\x83");  // the last of the 68 moved bytes: U+0143
  std::set<std::string> distinct(c.begin(), c.end());
  EXPECT_EQ(distinct.size(), 256u);
  for (int b = 0; b < 256; ++b) {
    size_t i = 0;
    EXPECT_EQ(byte_of_char(next_code_point(c[size_t(b)], i)), b);
  }
}

TEST(Regex, OnigurumaClassesAsPcre2) {
  EXPECT_EQ(onig_to_pcre2("a\\d"), "a\\d");
  // \s outside and inside a class, and [^\s...] kept a negated class
  const std::string s = onig_to_pcre2("\\s+[^\\s\\p{L}]");
  EXPECT_EQ(s.find("\\s"), std::string::npos);
  EXPECT_EQ(s.substr(0, 2), "[\\");
  EXPECT_NE(s.find("[^\\x{09}"), std::string::npos);
  // U+180E is not whitespace to Oniguruma (PCRE2's \s says it is)
  Regex re("\\s", false, "test");
  int n = 0;
  re.find_all("\xE1\xA0\x8E \xE3\x80\x80", true, [&](size_t, size_t) { ++n; });
  EXPECT_EQ(n, 2);  // the space and U+3000
}

TEST(Regex, EmptyMatchesAndPartialText) {
  Regex star("x*", false, "test");
  std::vector<std::pair<size_t, size_t>> m;
  star.find_all("axxb", true, [&](size_t a, size_t b) { m.emplace_back(a, b); });
  // Oniguruma's find_iter: (0,0), (1,3); the empty match at 3 right after is skipped; (4,4)
  const std::vector<std::pair<size_t, size_t>> want = {{0, 0}, {1, 3}, {4, 4}};
  EXPECT_EQ(m, want);
  // Text that may go on: a run of spaces at the end is not settled
  Regex ws(R"(\s+(?!\S)|\s+|\w+)", false, "test");
  m.clear();
  const size_t settled =
      ws.find_all("ab  cd  ", false, [&](size_t a, size_t b) { m.emplace_back(a, b); });
  // "ab", " ", " ", "cd" are settled (a space follows "cd"); the last spaces could grow
  EXPECT_EQ(settled, 6u);
  EXPECT_EQ(m.size(), 4u);
  m.clear();
  EXPECT_EQ(ws.find_all("ab  cd", false, [&](size_t a, size_t b) { m.emplace_back(a, b); }), 4u);
}

TEST(Bpe, MergesByRankLeftmostFirst) {
  const Tokenizer t = make(byte_level_json({{"a", "b"}, {"ab", "c"}, {"b", "c"}, {"a", "a"}}));
  EXPECT_EQ(t.encode("abc"), (Ids{257}));        // ab (rank 0), then abc (rank 1)
  EXPECT_EQ(t.encode("bcab"), (Ids{258, 256}));  // ab first although bc is left of it
  EXPECT_EQ(t.encode("aaa"), (Ids{259, 'a'}));   // the leftmost of two equal pairs
  EXPECT_EQ(t.encode("xy"), (Ids{'x', 'y'}));
  EXPECT_EQ(t.decode({258, 256, 'x'}), "bcabx");
}

TEST(Bpe, IgnoreMergesTakesAWholeWordFromTheVocabulary) {
  json j = byte_level_json({{"a", "b"}});
  j["model"]["vocab"]["xyz"] = 300;
  EXPECT_EQ(make(j).encode("xyz"), (Ids{'x', 'y', 'z'}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(make(j).encode("xyz"), (Ids{300}));
  EXPECT_EQ(make(j).encode("xyzab"), (Ids{'x', 'y', 'z', 256}));
}

TEST(Bpe, ByteFallbackUnknownAndFused) {
  // Characters, not bytes (no ByteLevel): é is not in the vocabulary.
  json vocab = {{"a", 0}, {"<unk>", 1}, {"<0xC3>", 2}, {"<0xA9>", 3}};
  json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  EXPECT_EQ(make(j).encode("a\xC3\xA9"
                           "a"),
            (Ids{0, 0}));  // dropped: no unk, no fallback
  j["model"]["unk_token"] = "<unk>";
  EXPECT_EQ(make(j).encode("a\xC3\xA9\xC3\xA9"), (Ids{0, 1, 1}));
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(make(j).encode("a\xC3\xA9\xC3\xA9"), (Ids{0, 1}));
  j["model"]["byte_fallback"] = true;
  EXPECT_EQ(make(j).encode("a\xC3\xA9"), (Ids{0, 2, 3}));
  EXPECT_EQ(make(j).encode("a\xC3\xA8"), (Ids{0, 1}));  // <0xA8> missing: unknown
}

json with_added(json j, const json& tok) {
  j["added_tokens"] = json::array({tok});
  return j;
}
json added(const std::string& content, uint32_t id) {
  return {{"id", id},        {"content", content}, {"special", true},     {"normalized", false},
          {"lstrip", false}, {"rstrip", false},    {"single_word", false}};
}

TEST(AddedTokens, MatchedBeforeTheModelWithTheirRules) {
  json a = added("<m>", 300);
  EXPECT_EQ(make(with_added(byte_level_json({}), a)).encode("hi<m>yo"),
            (Ids{'h', 'i', 300, 'y', 'o'}));
  a["lstrip"] = true;
  EXPECT_EQ(make(with_added(byte_level_json({}), a)).encode("a  <m>b"), (Ids{'a', 300, 'b'}));
  a["lstrip"] = false;
  a["rstrip"] = true;
  EXPECT_EQ(make(with_added(byte_level_json({}), a)).encode("a <m>  b"), (Ids{'a', ' ', 300, 'b'}));
  a["rstrip"] = false;
  a["single_word"] = true;
  const Tokenizer t = make(with_added(byte_level_json({}), a));
  EXPECT_EQ(t.encode("a<m>b"), bytes("a<m>b"));
  EXPECT_EQ(t.encode("a <m> b"), (Ids{'a', ' ', 300, ' ', 'b'}));
  // leftmost-longest among overlapping tokens
  json j = byte_level_json({});
  j["added_tokens"] = json::array({added("<a>", 300), added("<a><b>", 301), added("b>", 302)});
  EXPECT_EQ(make(j).encode("<a><b>b>"), (Ids{301, 302}));
  EXPECT_EQ(make(j).decode({301, 'x'}), "<a><b>x");
  EXPECT_EQ(make(j).decode({301, 'x'}, true), "x");
}

std::vector<std::string> pieces(const Tokenizer& t, const std::string& s) {
  std::vector<std::string> out;
  t.pre_tokenize(s, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

TEST(PreTokenizer, SplitBehaviours) {
  // The library's documented example: "the-final--countdown" split on "-"
  using V = std::vector<std::string>;
  auto split = [](const std::string& behavior, bool invert = false) {
    json j = byte_level_json({});
    j["pre_tokenizer"] = {{"type", "Split"},
                          {"pattern", {{"String", "-"}}},
                          {"behavior", behavior},
                          {"invert", invert}};
    return pieces(make(j), "the-final--countdown");
  };
  EXPECT_EQ(split("Removed"), (V{"the", "final", "countdown"}));
  EXPECT_EQ(split("Isolated"), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithPrevious"), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithNext"), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split("Contiguous"), (V{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(split("Removed", true), (V{"-", "-", "-"}));
}

TEST(PreTokenizer, ByteLevelWithGpt2Regex) {
  json pre = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  const Tokenizer t = make(byte_level_json({}, pre));
  using V = std::vector<std::string>;
  // a prefix space, then GPT-2's pattern: ' ?\p{L}+', contractions, '\s+(?!\S)'
  EXPECT_EQ(pieces(t, "Hello  world's 42"), (V{"\xC4\xA0Hello", "\xC4\xA0", "\xC4\xA0world", "'s",
                                               "\xC4\xA0"
                                               "42"}));
}

TEST(PostProcessor, TemplateAddsItsTokensUnlessAskedNot) {
  json j = byte_level_json({});
  j["added_tokens"] = json::array({added("<s>", 300), added("</s>", 301)});
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}})},
      {"special_tokens",
       {{"<s>", {{"id", "<s>"}, {"ids", {300}}, {"tokens", {"<s>"}}}},
        {"</s>", {{"id", "</s>"}, {"ids", {301}}, {"tokens", {"</s>"}}}}}}};
  const Tokenizer t = make(j);
  EXPECT_EQ(t.encode("ab"), (Ids{300, 'a', 'b', 301}));
  EXPECT_EQ(t.encode("ab", false), (Ids{'a', 'b'}));
  Ids streamed;
  StreamEncoder s(
      t, [&](const uint32_t* p, size_t n) { streamed.insert(streamed.end(), p, p + n); }, true, 1);
  s.feed("a");
  s.feed("b");
  s.finish();
  EXPECT_EQ(streamed, (Ids{300, 'a', 'b', 301}));
}

TEST(Normalizer, NfcAndSequence) {
  json j = byte_level_json({});
  j["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers", json::array({{{"type", "NFC"}}, {{"type", "Prepend"}, {"prepend", "_"}}})}};
  const Tokenizer t = make(j);
  EXPECT_EQ(t.normalize("e\xCC\x81"), "_\xC3\xA9");  // e + U+0301 -> é
  EXPECT_EQ(t.encode("e\xCC\x81"), (Ids{'_', 0xC3, 0xA9}));
  EXPECT_EQ(t.encode(""), Ids{});
}

TEST(Tokenizer, WhatItDoesNotSupportIsNamed) {
  auto error_of = [](const json& j) -> std::string {
    try {
      Tokenizer::from_json(j.dump(), "t.json");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  json j = byte_level_json({});
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_NE(error_of(j).find("normalizer.type: 'Lowercase' is not supported"), std::string::npos);
  j = byte_level_json({});
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", json::array({{{"type", "Metaspace"}}})}};
  EXPECT_NE(error_of(j).find("pre_tokenizer.pretokenizers[0].type"), std::string::npos);
  j = byte_level_json({});
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(error_of(j).find("model.type"), std::string::npos);
  j = byte_level_json({});
  j["truncation"] = {{"max_length", 8}};
  EXPECT_NE(error_of(j).find("truncation"), std::string::npos);
  j = byte_level_json({});
  j["model"]["merges"] = json::array({{"a", "zz"}});
  EXPECT_NE(error_of(j).find("model.merges[0]"), std::string::npos);
  j = byte_level_json({});
  j["model"]["dropout"] = 0.1;
  EXPECT_NE(error_of(j).find("model.dropout"), std::string::npos);
  j = byte_level_json({});
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(error_of(j).find("decoder.type"), std::string::npos);
  j = byte_level_json({});
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(error_of(j).find("pre_tokenizer.pattern"), std::string::npos);
  EXPECT_THROW(Tokenizer::from_json("{\"model\": ", "t.json"), Error);
  EXPECT_THROW(Tokenizer::load("/nonexistent/tokenizer.json"), Error);
  EXPECT_THROW(make(byte_level_json({})).decode({256}), Error);  // past the vocabulary
}

// Text that exercises every pipeline stage: words, contractions, digits, runs of spaces and
// newlines, CJK, combining marks (NFC), emoji, special tokens, invalid UTF-8.
std::string mixed_text(uint32_t seed, size_t n) {
  static const char* parts[] = {"the",
                                "The",
                                " quick",
                                "'s",
                                "'LL",
                                " 12345",
                                "3.14",
                                "  ",
                                "    ",
                                "\n",
                                "\n\n",
                                "\r\n",
                                "\t",
                                " \n ",
                                "\xE4\xBD\xA0\xE5\xA5\xBD",
                                "e\xCC\x81",
                                "\xC3\xA9",
                                "\xF0\x9F\x98\x80",
                                "<|endoftext|>",
                                "<|end",
                                "\xFF",
                                "\xE2\x82",
                                "--",
                                "!?",
                                " (x)",
                                "\xE3\x80\x80"};
  std::mt19937 g(seed);
  std::string s;
  while (s.size() < n) s += parts[g() % (sizeof parts / sizeof *parts)];
  return s;
}

TEST(Tokenizer, StreamingEqualsWholeAtAnyChunking) {
  BpeTrainer tr;
  tr.feed(mixed_text(1, 20000));
  BpeTrainOptions o;
  o.vocab_size = 400;
  const json trained = json::parse(tr.train(o).json);
  json gpt2 = trained;  // the same vocabulary behind GPT-2's ByteLevel regex
  gpt2["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  for (const json& j : {trained, gpt2}) {
    const Tokenizer t = make(j);
    for (uint32_t seed : {2u, 3u}) {
      const std::string text = mixed_text(seed, 6000);
      const Ids whole = t.encode(text);
      EXPECT_EQ(t.decode(whole), t.normalize(text));
      for (size_t chunk : {1, 7, 64, 1000}) {
        Ids got;
        StreamEncoder s(
            t, [&](const uint32_t* p, size_t n) { got.insert(got.end(), p, p + n); }, true, chunk);
        std::mt19937 g(seed + uint32_t(chunk));
        for (size_t i = 0; i < text.size();) {
          const size_t n = std::min<size_t>(1 + g() % 50, text.size() - i);
          s.feed(std::string_view(text).substr(i, n));
          i += n;
        }
        s.finish();
        EXPECT_EQ(got, whole) << "chunk " << chunk << " seed " << seed;
      }
    }
  }
}

TEST(BpeTrainer, TheLibrarysMergeOrder) {
  // Hugging Face's course corpus: (u,g) 20, (u,n) 16, (h,ug) 15, (p,un) 12, then a tie at 5
  // between (p,ug) and (hug,s) that the smaller pair (p is an alphabet id) wins, then (b,un).
  std::string text;
  for (auto [w, n] : std::vector<std::pair<const char*, int>>{
           {"hug", 10}, {"pug", 5}, {"pun", 12}, {"bun", 4}, {"hugs", 5}})
    for (int i = 0; i < n; ++i) text += std::string(w) + "\n";
  BpeTrainer tr;
  tr.feed(text);
  BpeTrainOptions o;
  o.vocab_size = 300;
  const BpeTrainer::Result r = tr.train(o);
  const json j = json::parse(r.json);
  const json want = json::array(
      {{"u", "g"}, {"u", "n"}, {"h", "ug"}, {"p", "un"}, {"p", "ug"}, {"hug", "s"}, {"b", "un"}});
  EXPECT_EQ(j["model"]["merges"], want);
  EXPECT_EQ(r.vocab, 256u + 7 + 1);
  EXPECT_EQ(j["model"]["vocab"]["ug"], 256);
  EXPECT_EQ(j["added_tokens"][0]["id"], 263);
  EXPECT_EQ(j["added_tokens"][0]["content"], "<|endoftext|>");
  // the budget: 256 bytes + 1 special + 3 merges
  o.vocab_size = 260;
  EXPECT_EQ(json::parse(tr.train(o).json)["model"]["merges"].size(), 3u);
  const Tokenizer t = make(j);
  EXPECT_EQ(t.encode("hugs pun<|endoftext|>"), (Ids{261, 220, 259, 263}));  // Ġ is 220, as in GPT-2
  o.vocab_size = 200;
  EXPECT_THROW(tr.train(o), Error);
  EXPECT_THROW(BpeTrainer().train(BpeTrainOptions{}), Error);
}

}  // namespace
}  // namespace tq::text
