// The data layer: token shards and their hostile forms, meta.json, the val choice, prepare's
// output (reproducible, any thread count, no partial folder), and the Brown corpus as text.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "core/common.h"
#include "data/brown.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "io/file.h"
#include "testing.h"
#include "text/tokenizer.h"

namespace tq::data {
namespace {

using json = nlohmann::json;

using test::exists;
using test::read_all;
using test::tmp_path;
using test::write_all;
std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d))
      if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) names.push_back(e->d_name);
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}
void remove_tree(const std::string& dir) {
  for (const std::string& n : list_dir(dir)) {
    const std::string p = dir + "/" + n;
    struct stat st;
    if (lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      remove_tree(p);
    } else {
      std::remove(p.c_str());
    }
  }
  rmdir(dir.c_str());
}
// A fresh empty folder, removed with its files at the end of the test.
struct Folder {
  std::string path;
  explicit Folder(const std::string& name) : path(tmp_path(name)) {
    remove_tree(path);
    EXPECT_EQ(mkdir(path.c_str(), 0777), 0) << path;
  }
  ~Folder() { remove_tree(path); }
};

// The Error's message, or "" if f throws none.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
#define EXPECT_ERROR(stmt, part)                                                 \
  do {                                                                           \
    const std::string what_ = error_of([&] { stmt; });                           \
    EXPECT_NE(what_.find(part), std::string::npos)                               \
        << "wanted an Error with \"" << (part) << "\", got \"" << what_ << "\""; \
    EXPECT_EQ(what_.find('\n'), std::string::npos) << what_;                     \
  } while (0)

// ---- shards

std::string shard_bytes(int32_t magic, int32_t version, int32_t count,
                        const std::vector<uint32_t>& ids) {
  std::vector<int32_t> h(kShardHeaderInts, 0);
  h[0] = magic, h[1] = version, h[2] = count;
  std::string s(reinterpret_cast<const char*>(h.data()), kShardHeaderBytes);
  s.append(reinterpret_cast<const char*>(ids.data()), ids.size() * 4);
  return s;
}

TEST(Shard, RoundTrip) {
  const std::string path = tmp_path("rt.bin");
  const std::vector<uint32_t> ids = {0, 5, 999, 17, 3, 3};
  write_shard(path, ids.data(), ids.size());
  EXPECT_FALSE(exists(path + ".tmp." + std::to_string(getpid())));
  // llm.c's layout, byte for byte
  EXPECT_EQ(read_all(path), shard_bytes(20240801, 7, 6, ids));
  const Shard s(path, 1000);
  ASSERT_EQ(s.size(), ids.size());
  EXPECT_EQ(std::vector<uint32_t>(s.ids(), s.ids() + s.size()), ids);
  EXPECT_EQ(s.path(), path);
  Shard moved = Shard(path, 1000);
  EXPECT_EQ(moved.ids()[2], 999u);

  write_shard(path, nullptr, 0);  // an empty shard is a shard
  EXPECT_EQ(Shard(path, 1).size(), 0u);
  std::remove(path.c_str());
}

TEST(Shard, WriterStreamsAndLeavesNothingUncommitted) {
  const std::string path = tmp_path("stream.bin");
  std::vector<uint32_t> all;
  {
    ShardWriter w(path);
    for (uint32_t i = 0; i < 1000; ++i) {
      const uint32_t piece[3] = {i, i + 1, i + 2};
      w.append(piece, 3);
      all.insert(all.end(), piece, piece + 3);
    }
    EXPECT_EQ(w.size(), 3000u);
    w.commit();
  }
  EXPECT_EQ(read_all(path), shard_bytes(kShardMagic, kShardVersion, 3000, all));
  std::remove(path.c_str());
  {
    ShardWriter w(path);
    w.append(all.data(), 10);
  }
  EXPECT_FALSE(exists(path));
  EXPECT_FALSE(exists(path + ".tmp." + std::to_string(getpid())));
  // past the header's int32 count: refused before anything is read or written
  EXPECT_ERROR(write_shard(path, nullptr, size_t(kMaxShardTokens) + 1),
               "at most 2147483647 tokens");
  EXPECT_FALSE(exists(path));
}

TEST(Shard, HostileFilesAreErrors) {
  const std::string path = tmp_path("bad.bin");
  const std::vector<uint32_t> ids = {1, 2, 3, 4};
  struct Case {
    std::string bytes, part;
  };
  std::string truncated_header = shard_bytes(kShardMagic, kShardVersion, 0, {}).substr(0, 100);
  const std::vector<Case> cases = {
      {shard_bytes(12345, 7, 4, ids),
       "is not a token shard (magic 12345, want 20240801): make it with tiny-qwen3 prepare"},
      {shard_bytes(kShardMagic, 1, 4, ids), "version 1, want 7"},
      {shard_bytes(kShardMagic, 7, 5, ids), "is truncated: its header says 5 tokens"},
      {shard_bytes(kShardMagic, 7, 3, ids), "has 4 bytes past its 3 tokens"},
      {shard_bytes(kShardMagic, 7, 4, ids) + "xy", "has 2 bytes past its 4 tokens"},
      {shard_bytes(kShardMagic, 7, 4, ids).substr(0, kShardHeaderBytes + 14),
       "but 14 bytes follow it"},
      {shard_bytes(kShardMagic, 7, -1, ids), "negative token count (-1)"},
      {truncated_header, "is truncated: 100 bytes, shorter than a token shard's 1024-byte header"},
      {"ab", "is truncated: 2 bytes"},
      {"", "is truncated: 0 bytes"},
      {shard_bytes(kShardMagic, 7, 4, {1, 2, 1000, 7}),
       "token 2 is id 1000, past the vocabulary of 1000"},
      {shard_bytes(kShardMagic, 7, 4, {1, 2, 3, 4294967295u}), "token 3 is id 4294967295"},
  };
  for (const Case& c : cases) {
    write_all(path, c.bytes);
    EXPECT_ERROR(Shard(path, 1000), c.part);
  }
  // the first bad id, also deep in a long shard (past the first chunk the reader scans)
  std::vector<uint32_t> many(200000, 7);
  many[150001] = 5000, many[190000] = 6000;
  write_shard(path, many.data(), many.size());
  EXPECT_ERROR(Shard(path, 1000), "token 150001 is id 5000");
  EXPECT_EQ(Shard(path, 6001).size(), many.size());
  std::remove(path.c_str());
  EXPECT_ERROR(Shard(path, 1000), "cannot open");
}

TEST(Shard, ListsASplitsShardsInOrder) {
  Folder dir("list");
  EXPECT_EQ(shard_name("train", 3), "train_000003.bin");
  EXPECT_EQ(shard_name("val", 1234567), "val_1234567.bin");
  EXPECT_ERROR(list_shards(dir.path, "train"), "has no train shards (train_000000.bin, ...)");
  for (const char* n : {"train_000001.bin", "train_000000.bin", "train_000002.bin",
                        "val_000000.bin", "train_000003.bin.tmp.12", "train_3.bin", "train_x.bin",
                        "meta.json", "trainer_000004.bin", "train_0000005.bin"})
    write_all(dir.path + "/" + n, "");
  EXPECT_EQ(
      list_shards(dir.path, "train"),
      (std::vector<std::string>{dir.path + "/train_000000.bin", dir.path + "/train_000001.bin",
                                dir.path + "/train_000002.bin"}));
  EXPECT_EQ(list_shards(dir.path, "val"), std::vector<std::string>{dir.path + "/val_000000.bin"});
  std::remove((dir.path + "/train_000001.bin").c_str());
  EXPECT_ERROR(list_shards(dir.path, "train"), "has train_000002.bin but no train_000001.bin");
  EXPECT_ERROR(list_shards(dir.path + "/nope", "val"), "cannot open folder");
}

// ---- meta.json

ShardMeta sample_meta() {
  ShardMeta m;
  m.tokenizer_path = "/models/qwen3/tokenizer.json";
  m.tokenizer_sha256 = std::string(64, 'a');
  m.vocab_size = 151669;
  m.eos_id = 151643;
  m.train = {95, 1000, {"train_000000.bin", "train_000001.bin"}};
  m.val = {5, 40, {"val_000000.bin"}};
  m.val_fraction = 0.05;
  m.seed = 18446744073709551615ull;
  m.shard_tokens = 600;
  m.command = "tiny-qwen3 prepare --tokenizer t.json --jsonl \"a b.jsonl\" --out d";
  return m;
}

void expect_same(const ShardMeta& a, const ShardMeta& b) {
  EXPECT_EQ(a.tokenizer_path, b.tokenizer_path);
  EXPECT_EQ(a.tokenizer_sha256, b.tokenizer_sha256);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.eos_id, b.eos_id);
  for (auto [x, y] : {std::pair{&a.train, &b.train}, std::pair{&a.val, &b.val}}) {
    EXPECT_EQ(x->documents, y->documents);
    EXPECT_EQ(x->tokens, y->tokens);
    EXPECT_EQ(x->shards, y->shards);
  }
  EXPECT_EQ(a.val_fraction, b.val_fraction);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.shard_tokens, b.shard_tokens);
  EXPECT_EQ(a.command, b.command);
}

TEST(Meta, RoundTrip) {
  Folder dir("meta");
  const ShardMeta m = sample_meta();
  write_meta(dir.path, m);
  EXPECT_EQ(list_dir(dir.path), std::vector<std::string>{"meta.json"});
  const json j = json::parse(read_all(dir.path + "/meta.json"));
  EXPECT_EQ(j["format"], "tiny-qwen3-shards");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["tokenizer"]["eos_id"], 151643);
  EXPECT_EQ(j["splits"]["val"]["shards"][0], "val_000000.bin");
  expect_same(read_meta(dir.path), m);
  ShardMeta empty_val = m;  // an empty split: no documents, no shard
  empty_val.val = {};
  empty_val.val_fraction = 0;
  write_meta(dir.path, empty_val);
  expect_same(read_meta(dir.path), empty_val);
}

TEST(Meta, HostileFilesAreErrors) {
  Folder dir("meta_bad");
  const std::string path = dir.path + "/meta.json";
  EXPECT_ERROR(read_meta(dir.path), "cannot open");
  const json good = json::parse(meta_json(sample_meta()));
  struct Case {
    std::function<void(json&)> edit;
    std::string part;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j = json::array(); }, "not a JSON object"},
      {[](json& j) { j.erase("format"); }, "(\"format\" is missing, want \"tiny-qwen3-shards\")"},
      {[](json& j) { j["format"] = "safetensors"; },
       "is not a tiny-qwen3 shard folder's meta.json"},
      {[](json& j) { j["format"] = 7; }, "(\"format\" is 7,"},
      {[](json& j) { j["version"] = 2; }, "is of version 2, this tiny-qwen3 reads version 1"},
      {[](json& j) { j["version"] = "1"; }, "is of version \"1\""},
      {[](json& j) { j.erase("tokenizer"); }, "no field \"tokenizer\""},
      {[](json& j) { j["tokenizer"] = "t.json"; }, "\"tokenizer\" must be an object"},
      {[](json& j) { j["tokenizer"]["path"] = "rel/t.json"; },
       "\"tokenizer.path\" must be an absolute path, not \"rel/t.json\""},
      {[](json& j) { j["tokenizer"]["path"] = 3; }, "\"tokenizer.path\" must be a string, not 3"},
      {[](json& j) { j["tokenizer"]["sha256"] = "ABC"; }, "\"tokenizer.sha256\" must be 64"},
      {[](json& j) { j["tokenizer"]["vocab_size"] = -1; },
       "\"tokenizer.vocab_size\" must be a whole number in 1..4294967295, not -1"},
      {[](json& j) { j["tokenizer"]["vocab_size"] = 4294967296; }, "not 4294967296"},
      {[](json& j) { j["tokenizer"]["vocab_size"] = "5"; }, "\"tokenizer.vocab_size\""},
      {[](json& j) { j["tokenizer"]["eos_id"] = 151669; },
       "\"tokenizer.eos_id\" must be a whole number in 0..151668"},
      {[](json& j) { j["tokenizer"].erase("eos_id"); }, "no field \"tokenizer.eos_id\""},
      {[](json& j) { j["val_fraction"] = 1; }, "\"val_fraction\" must be a number in [0, 1)"},
      {[](json& j) { j["val_fraction"] = -0.5; }, "not -0.5"},
      {[](json& j) { j["val_fraction"] = nullptr; }, "not null"},
      {[](json& j) { j["seed"] = -3; }, "\"seed\" must be a whole number"},
      {[](json& j) { j["seed"] = 1.5; }, "not 1.5"},
      {[](json& j) { j["shard_tokens"] = 0; },
       "\"shard_tokens\" must be a whole number in 1..2147483647"},
      {[](json& j) { j["shard_tokens"] = 2147483648; }, "not 2147483648"},
      {[](json& j) { j["command"] = json::array(); }, "\"command\" must be a string"},
      {[](json& j) { j.erase("splits"); }, "no field \"splits\""},
      {[](json& j) { j["splits"].erase("val"); }, "no field \"splits.val\""},
      {[](json& j) { j["splits"]["train"]["documents"] = -3; },
       "\"splits.train.documents\" must be a whole number in 0..18446744073709551615, not -3"},
      {[](json& j) { j["splits"]["val"]["tokens"] = "40"; }, "\"splits.val.tokens\""},
      {[](json& j) { j["splits"]["val"]["shards"] = "val_000000.bin"; },
       "\"splits.val.shards\" must be a list"},
      {[](json& j) { j["splits"]["val"]["shards"][0] = "../x"; },
       "\"splits.val.shards\" holds \"../x\" where val_000000.bin belongs"},
      {[](json& j) { j["splits"]["val"]["shards"][0] = "/abs"; }, "holds \"/abs\""},
      {[](json& j) { j["splits"]["val"]["shards"][0] = "sub/val_000000.bin"; },
       "holds \"sub/val_000000.bin\""},
      {[](json& j) { j["splits"]["train"]["shards"][1] = "train_000000.bin"; },
       "where train_000001.bin belongs"},
      {[](json& j) { j["splits"]["val"]["shards"][0] = 0; }, "must hold file names, not 0"},
      {[](json& j) { j["splits"]["val"]["shards"].push_back("val_000001.bin"); },
       "\"splits.val\" has 40 tokens, which fill 1 shards of 600, not 2"},
      {[](json& j) { j["splits"]["train"]["tokens"] = 1201; }, "which fill 3 shards of 600, not 2"},
      {[](json& j) { j["splits"]["val"]["documents"] = 0; }, "has 40 tokens but no documents"},
  };
  for (const Case& c : cases) {
    json j = good;
    c.edit(j);
    write_all(path, j.dump(1));
    EXPECT_ERROR(read_meta(dir.path), c.part);
  }
  for (const std::string& text : {std::string(""), std::string("{\"format\": "),
                                  std::string("\x89PNG\r\n"), std::string("{} x")}) {
    write_all(path, text);
    EXPECT_ERROR(read_meta(dir.path), "meta.json: not JSON (at byte");
  }
  write_all(path, "{\"format\": \"tiny-qwen3-shards\", \"version\": 1E400}");  // (fuzzed)
  EXPECT_ERROR(read_meta(dir.path), "meta.json: not JSON that can be read (a number out of range)");
  write_all(path, "{\"format\": \"a\\nb\"}");  // what the file holds stays on one line
  EXPECT_ERROR(read_meta(dir.path), "(\"format\" is \"a\\nb\"");
  // every error names the file and says what to do
  write_all(path, "[]");
  EXPECT_ERROR(read_meta(dir.path), path + ": not a JSON object: make the folder again");
}

// ---- the val choice

TEST(Val, CountsFollowTheFraction) {
  EXPECT_EQ(val_count(0, 0.5), 0u);
  EXPECT_EQ(val_count(1, 0.5), 0u);    // the one document trains
  EXPECT_EQ(val_count(2, 0.001), 1u);  // at least one
  EXPECT_EQ(val_count(100, 0.0), 0u);  // none asked, none given
  EXPECT_EQ(val_count(100, 0.05), 5u);
  EXPECT_EQ(val_count(30, 0.05), 2u);  // 1.5 rounds up
  EXPECT_EQ(val_count(10, 0.99), 9u);  // train keeps one
  EXPECT_EQ(val_count(1000000000000ull, 0.25), 250000000000ull);
}

// The same choice by a plain array and std::mt19937_64, as the header describes it.
std::vector<uint64_t> dense_choice(uint64_t n, uint64_t k, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<uint64_t> a(n);
  for (uint64_t i = 0; i < n; ++i) a[i] = i;
  for (uint64_t i = 0; i < k; ++i) {
    const uint64_t b = n - i;
    uint64_t x;
    do x = g();
    while (x < (0 - b) % b);
    std::swap(a[i], a[i + x % b]);
  }
  std::vector<uint64_t> v(a.begin(), a.begin() + long(k));
  std::sort(v.begin(), v.end());
  return v;
}

TEST(Val, ChoiceIsSeededAndPortable) {
  for (uint64_t seed : {0ull, 1ull, 42ull, 18446744073709551615ull})
    for (uint64_t n : {2ull, 3ull, 10ull, 1000ull}) {
      const std::vector<uint64_t> v = val_documents(n, 0.3, seed);
      EXPECT_EQ(v, dense_choice(n, val_count(n, 0.3), seed)) << n << " " << seed;
      EXPECT_EQ(v, val_documents(n, 0.3, seed));
      EXPECT_EQ(std::set<uint64_t>(v.begin(), v.end()).size(), v.size());
      for (uint64_t d : v) EXPECT_LT(d, n);
    }
  EXPECT_NE(val_documents(1000, 0.1, 0), val_documents(1000, 0.1, 1));
  // The generator's output is fixed by the standard; this pins the method on top of it (a
  // change here changes every prepared folder's split).
  std::mt19937_64 g;
  g.discard(9999);
  ASSERT_EQ(g(), 9981545732273789042ull);  // the standard's check of the generator
  EXPECT_EQ(val_documents(20, 0.25, 0), (std::vector<uint64_t>{0, 3, 14, 15, 16}));
  EXPECT_TRUE(val_documents(100, 0, 7).empty());
  EXPECT_EQ(val_documents(1ull << 40, 1e-10, 3).size(), 110u);  // n need not fit in memory
}

// ---- the Brown corpus

TEST(Brown, TaggedTextReadsAsPrinted) {
  struct Case {
    std::string tagged, text;
  };
  const std::vector<Case> cases = {
      {"", ""},
      {"\n\n\n", ""},
      {"\n\n\tThe/at jury/nn said/vbd ./.\n\n", "The jury said.\n"},
      // sentences of a paragraph on one line, paragraphs apart
      {"\tA/at b/nn ./.\nC/np d/vb ?/.\n\n\n\tE/np ./.\n", "A b. C d?\n\nE.\n"},
      // quotes: `` opens, '' closes; a sentence's end and commas go inside the closing one
      {"\tproduced/vbd ``/`` no/at evidence/nn ''/'' that/cs ./.\n",
       "produced \"no evidence\" that.\n"},
      {"\t``/`` Only/rb a/at few/ap ''/'' ,/, he/pps said/vbd ,/, ``/`` or/cc none/pn ''/'' ./.\n",
       "\"Only a few,\" he said, \"or none.\"\n"},
      {"\t``/`` Why/wrb ''/'' ?/. ?/.\n", "\"Why?\"\n"},  // the corpus doubles some ends
      {"\tit/pps ;/. ;/. so/rb Jr./np ./.\n", "it; so Jr.\n"},
      {"\tsaid/vbd ``/`` yes/rb ''/'' ;/. then/rb\n", "said \"yes\"; then\n"},  // ; : stay out
      // brackets, colons, dashes
      {"\trecommended/vbd that/cs :/: (/( 1/cd )/) Four/cd -- [/( sic/rb ]/) x/nn ./.\n",
       "recommended that: (1) Four -- [sic] x.\n"},
      // single quotes alternate; words keep their own slashes and apostrophes
      {"\tthe/at '/' Met/np '/' ,/, 1/2/cd and/or/cc Atlanta's/np$ ./.\n",
       "the 'Met', 1/2 and/or Atlanta's.\n"},
      // a headline is a paragraph of its own
      {"\tX/np ./.\n\n\nMerger/nn-hl proposed/vbn-hl \nHowever/wrb ,/, no/at ./.\n",
       "X.\n\nMerger proposed\n\nHowever, no.\n"},
      {"A/at\r\n\r\nB/at\r\n", "A\n\nB\n"},
  };
  for (const Case& c : cases) EXPECT_EQ(brown_to_text(c.tagged), c.text) << c.tagged;
}

TEST(Brown, FolderSamplesInOrder) {
  Folder dir("brown");
  EXPECT_ERROR(brown_documents(dir.path), "has no Brown corpus samples (ca01 ... cr09)");
  write_all(dir.path + "/README", "not/a sample/nn");
  write_all(dir.path + "/CONTENTS", "x");
  write_all(dir.path + "/cats.txt", "ca01 news");
  write_all(dir.path + "/cz01", "x/nn");
  EXPECT_ERROR(brown_documents(dir.path), "has no Brown corpus samples");
  write_all(dir.path + "/cb02", "\n\n\tSecond/od ./.\n");
  write_all(dir.path + "/ca01", "\n\n\tFirst/od ./.\n");
  uint64_t bytes = 0;
  EXPECT_EQ(brown_documents(dir.path, &bytes), (std::vector<std::string>{"First.\n", "Second.\n"}));
  EXPECT_EQ(bytes, 33u);
  EXPECT_ERROR(brown_documents(dir.path + "/nope"), "cannot open the Brown corpus folder");
}

// ---- prepare (these need the tokenizer library)

// GPT-2's byte-to-character table: the byte-level BPE's vocabulary spells bytes with these.
std::string byte_char(int b) {
  int cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
    int n = 0;
    for (int c = 0; c < b; ++c) n += !((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174);
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// A byte-level BPE: the 256 bytes (id = byte), two merges, and <|endoftext|> (258) when asked.
std::string tiny_tokenizer_json(bool eos = true) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  vocab["he"] = 256;
  vocab[byte_char(' ') + "t"] = 257;
  json added = json::array();
  if (eos)
    added.push_back({{"id", 258},
                     {"content", "<|endoftext|>"},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  const json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "ByteLevel"},
        {"add_prefix_space", true},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", {"h e", byte_char(' ') + " t"}}}},
  };
  return j.dump();
}

// A folder with the tokenizer and some documents, and what prepare must make of them.
struct Prepared {
  Folder dir;
  std::string tok_path;
  std::vector<std::string> docs;
  explicit Prepared(const std::string& name) : dir(name), tok_path(dir.path + "/tokenizer.json") {
    write_all(tok_path, tiny_tokenizer_json());
    std::mt19937 g(7);
    const char* words[] = {"the", "he", "then", "other", "x", "héllo", "\xff\xfe", "\n", "42"};
    for (int d = 0; d < 37; ++d) {
      std::string s;
      const int n = d == 5 ? 0 : int(g() % 40);  // document 5 is empty
      for (int w = 0; w < n; ++w) s += std::string(w ? " " : "") + words[g() % 9];
      docs.push_back(s);
    }
  }
  PrepareArgs args(const std::string& out) const {
    PrepareArgs a;
    a.tokenizer = tok_path;
    a.out = dir.path + "/" + out;
    a.val_fraction = 0.2;
    a.seed = 11;
    a.shard_tokens = 50;
    a.command_line = "tiny-qwen3 prepare (test)";
    return a;
  }
  std::vector<std::string> write_inputs() const {
    std::vector<std::string> paths;
    for (size_t d = 0; d < docs.size(); ++d) {
      paths.push_back(dir.path + "/doc" + std::to_string(100 + d) + ".txt");
      write_all(paths.back(), docs[d]);
    }
    return paths;
  }
  // Each split's ids: its documents in order, each encoded alone, then end-of-text.
  std::vector<uint32_t> expected(bool val, uint64_t seed, double fraction) const {
    const text::Tokenizer tok = text::Tokenizer::from_json(tiny_tokenizer_json(), "tiny");
    const std::vector<uint64_t> v = val_documents(docs.size(), fraction, seed);
    std::vector<uint32_t> out;
    for (uint64_t d = 0; d < docs.size(); ++d) {
      if (std::binary_search(v.begin(), v.end(), d) != val) continue;
      const std::vector<uint32_t> ids = tok.encode(docs[d]);
      if (ids.empty()) continue;
      out.insert(out.end(), ids.begin(), ids.end());
      out.push_back(258);
    }
    return out;
  }
};

std::vector<uint32_t> read_split(const std::string& dir, const SplitMeta& m, uint64_t cap) {
  std::vector<uint32_t> all;
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const Shard s(dir + "/" + m.shards[i], 259);
    EXPECT_LE(s.size(), cap);
    if (i + 1 < m.shards.size()) {
      EXPECT_EQ(s.size(), cap);  // only the last is short
    }
    all.insert(all.end(), s.ids(), s.ids() + s.size());
  }
  return all;
}

TEST(Prepare, FilesBecomeShardsOfWholeDocuments) {
  Prepared p("prep_files");
  PrepareArgs a = p.args("out");
  a.inputs = p.write_inputs();
  ASSERT_EQ(prepare(a), 0);
  const ShardMeta m = read_meta(a.out);
  EXPECT_EQ(m.tokenizer_path.front(), '/');
  EXPECT_EQ(m.tokenizer_sha256, sha256_file(p.tok_path));
  EXPECT_EQ(m.vocab_size, 259u);
  EXPECT_EQ(m.eos_id, 258u);
  EXPECT_EQ(m.command, a.command_line);
  EXPECT_EQ(m.seed, 11u);
  EXPECT_EQ(m.train.documents + m.val.documents, 37u);
  EXPECT_EQ(m.val.documents, val_count(37, 0.2));
  const std::vector<uint32_t> train = read_split(a.out, m.train, 50),
                              val = read_split(a.out, m.val, 50);
  EXPECT_EQ(train, p.expected(false, 11, 0.2));
  EXPECT_EQ(val, p.expected(true, 11, 0.2));
  EXPECT_EQ(m.train.tokens, train.size());
  EXPECT_EQ(m.val.tokens, val.size());
  EXPECT_GT(m.train.shards.size(), 2u);
  std::vector<std::string> want = {"meta.json"};
  for (const auto& s : m.train.shards) want.push_back(s);
  for (const auto& s : m.val.shards) want.push_back(s);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(list_dir(a.out), want);  // and nothing else (no temporaries)
  EXPECT_EQ(list_shards(a.out, "train").size(), m.train.shards.size());
  EXPECT_FALSE(exists(a.out + ".tmp." + std::to_string(getpid())));
  EXPECT_EQ(sha256_file(p.tok_path).size(), 64u);
}

TEST(Prepare, SameBytesForAnyThreadCountAndBatching) {
  Prepared p("prep_threads");
  const std::vector<std::string> inputs = p.write_inputs();
  std::map<std::string, std::string> first;
  int run = 0;
  for (int threads : {1, 3, 0}) {
    for (uint64_t stream : {uint64_t(64) << 20, uint64_t(20)}) {  // also as streamed files
      PrepareArgs a = p.args("out" + std::to_string(run++));
      a.inputs = inputs;
      a.threads = threads;
      prepare_tuning.stream_bytes = stream;
      prepare(a);
      prepare_tuning.stream_bytes = uint64_t(64) << 20;
      std::map<std::string, std::string> files;
      for (const std::string& n : list_dir(a.out)) files[n] = read_all(a.out + "/" + n);
      if (first.empty()) first = files;
      EXPECT_EQ(files, first) << "threads " << threads << ", streamed past " << stream;
    }
  }
  // another seed chooses other documents; the same seed the same
  PrepareArgs a = p.args("seed");
  a.inputs = inputs;
  a.seed = 12;
  prepare(a);
  EXPECT_NE(read_all(a.out + "/val_000000.bin"), first["val_000000.bin"]);
  EXPECT_EQ(read_split(a.out, read_meta(a.out).val, 50), p.expected(true, 12, 0.2));
}

TEST(Prepare, JsonlLinesAreDocuments) {
  Prepared p("prep_jsonl");
  std::string jsonl = "\xEF\xBB\xBF";
  for (size_t d = 0; d < p.docs.size(); ++d) {
    // (JSON holds no invalid UTF-8: those documents go as files only)
    if (p.docs[d].find('\xff') != std::string::npos) p.docs[d] = "plain " + std::to_string(d);
    const json line = {{"id", d}, {"text", p.docs[d]}};
    jsonl += line.dump() + (d % 5 == 0 ? "\r\n\n  \n" : "\n");  // blank lines are no documents
  }
  const std::string path = p.dir.path + "/docs.jsonl";
  write_all(path, jsonl);
  PrepareArgs a = p.args("out");
  a.jsonl = path;
  a.val_fraction = 0.1;
  a.threads = 2;
  ASSERT_EQ(prepare(a), 0);
  const ShardMeta m = read_meta(a.out);
  EXPECT_EQ(m.train.documents + m.val.documents, 37u);
  EXPECT_EQ(read_split(a.out, m.train, 50), p.expected(false, 11, 0.1));
  EXPECT_EQ(read_split(a.out, m.val, 50), p.expected(true, 11, 0.1));

  for (const auto& [bad, part] : std::vector<std::pair<std::string, std::string>>{
           {"{\"text\": \"a\"}\n\n{\"text\": 3}\n", "docs.jsonl line 3: no string field \"text\""},
           {"{\"text\": \"a\"}\n[1]\n", "line 2: no string field"},
           {"{\"text\": \"a\"}\n{\"text\": \"b\"\n", "line 2: not JSON"},
           {"{\"text\": \"a\", \"n\": 1e999}\n", "line 1: not JSON"},
           {"\n \n", "has no documents"},
       }) {
    write_all(path, bad);
    PrepareArgs b = p.args("bad");
    b.jsonl = path;
    EXPECT_ERROR(prepare(b), part);
    EXPECT_FALSE(exists(b.out));
    EXPECT_FALSE(exists(b.out + ".tmp." + std::to_string(getpid())));
  }
}

TEST(Prepare, SplitsAndShardSizes) {
  Prepared p("prep_sizes");
  const std::vector<std::string> inputs = p.write_inputs();
  PrepareArgs a = p.args("noval");
  a.inputs = {inputs.begin(), inputs.begin() + 12};
  a.val_fraction = 0;
  a.shard_tokens = 3;  // documents run on across shards
  prepare(a);
  ShardMeta m = read_meta(a.out);
  EXPECT_EQ(m.val.documents, 0u);
  EXPECT_EQ(m.val.tokens, 0u);
  EXPECT_TRUE(m.val.shards.empty());
  EXPECT_ERROR(list_shards(a.out, "val"), "has no val shards");
  EXPECT_EQ(m.train.shards.size(), (m.train.tokens + 2) / 3);
  Prepared twelve("prep_sizes12");
  twelve.docs.resize(12);
  EXPECT_EQ(read_split(a.out, m.train, 3), twelve.expected(false, 11, 0));

  a = p.args("ones");
  a.inputs = {inputs.begin(), inputs.begin() + 3};
  a.val_fraction = 0;
  a.shard_tokens = 1;  // one token a shard
  prepare(a);
  m = read_meta(a.out);
  EXPECT_EQ(m.train.shards.size(), m.train.tokens);
  EXPECT_EQ(m.train.shards.back(), shard_name("train", m.train.tokens - 1));

  a = p.args("big");
  a.inputs = inputs;
  a.shard_tokens = 1000000;  // everything in one shard a split
  prepare(a);
  m = read_meta(a.out);
  EXPECT_EQ(m.train.shards, std::vector<std::string>{"train_000000.bin"});
  EXPECT_EQ(m.val.shards, std::vector<std::string>{"val_000000.bin"});

  a = p.args("one");
  a.inputs = {inputs[0]};  // one document: it trains
  a.val_fraction = 0.5;
  prepare(a);
  m = read_meta(a.out);
  EXPECT_EQ(m.train.documents, 1u);
  EXPECT_EQ(m.val.documents, 0u);
}

TEST(Prepare, BadArgumentsAndInputLeaveNothing) {
  Prepared p("prep_bad");
  const std::vector<std::string> inputs = p.write_inputs();
  auto with = [&](const std::function<void(PrepareArgs&)>& edit) {
    PrepareArgs a = p.args("out");
    a.inputs = inputs;
    edit(a);
    return a;
  };
  EXPECT_ERROR(prepare(with([](PrepareArgs& a) { a.inputs.clear(); })),
               "give exactly one source of documents");
  EXPECT_ERROR(prepare(with([&](PrepareArgs& a) { a.jsonl = inputs[0]; })), "exactly one");
  EXPECT_ERROR(prepare(with([](PrepareArgs& a) { a.val_fraction = 1; })),
               "--val-fraction must be in [0, 1)");
  EXPECT_ERROR(prepare(with([](PrepareArgs& a) { a.val_fraction = -0.1; })), "--val-fraction");
  EXPECT_ERROR(prepare(with([](PrepareArgs& a) { a.shard_tokens = 0; })),
               "--shard-tokens must be 1..2147483647");
  EXPECT_ERROR(prepare(with([](PrepareArgs& a) { a.shard_tokens = 1ull << 31; })),
               "--shard-tokens");
  EXPECT_ERROR(prepare(with([](PrepareArgs& a) { a.threads = -1; })), "--threads");
  EXPECT_ERROR(prepare(with([](PrepareArgs& a) { a.out.clear(); })), "give --out DIR");
  EXPECT_ERROR(prepare(with([](PrepareArgs& a) { a.inputs.push_back(a.out + "x"); })),
               "cannot read input");
  EXPECT_ERROR(prepare(with([&](PrepareArgs& a) { a.inputs.push_back(p.dir.path); })),
               "is not a regular file");
  const std::string no_eos = p.dir.path + "/no_eos.json";
  write_all(no_eos, tiny_tokenizer_json(false));
  EXPECT_ERROR(prepare(with([&](PrepareArgs& a) { a.tokenizer = no_eos; })),
               "has no end-of-text token");
  // documents with no tokens at all
  const std::string empty = p.dir.path + "/empty.txt";
  write_all(empty, "");
  EXPECT_ERROR(prepare(with([&](PrepareArgs& a) {
                 a.inputs = {empty, empty};
               })),
               "the 2 documents have no tokens");
  EXPECT_FALSE(exists(p.dir.path + "/out"));
  EXPECT_FALSE(exists(p.dir.path + "/out.tmp." + std::to_string(getpid())));

  // an existing --out: refused unless an empty folder
  const PrepareArgs a = with([](PrepareArgs&) {});
  write_all(a.out, "x");
  EXPECT_ERROR(prepare(a), "exists and is not a folder");
  std::remove(a.out.c_str());
  ASSERT_EQ(mkdir(a.out.c_str(), 0777), 0);
  write_all(a.out + "/keep", "x");
  EXPECT_ERROR(prepare(a), "out exists and is not empty: remove it or choose another --out");
  EXPECT_EQ(list_dir(a.out), std::vector<std::string>{"keep"});
  std::remove((a.out + "/keep").c_str());
  EXPECT_EQ(prepare(a), 0);  // an empty one is filled
  remove_tree(a.out);
  PrepareArgs slash = a;
  slash.out += "/";
  EXPECT_EQ(prepare(slash), 0);
  EXPECT_TRUE(exists(a.out + "/meta.json"));
  remove_tree(a.out);
  EXPECT_ERROR(prepare(with([&](PrepareArgs& b) { b.out = p.dir.path + "/no/such/out"; })),
               "cannot create folder");
}

TEST(Prepare, BrownCorpus) {
  Prepared p("prep_brown");
  const std::string brown = p.dir.path + "/brown";
  ASSERT_EQ(mkdir(brown.c_str(), 0777), 0);
  write_all(brown + "/README", "not a sample");
  write_all(brown + "/cb01", "\n\n\tThe/at other/ap ./.\n");
  write_all(brown + "/ca01", "\n\n\tHe/pps said/vbd ``/`` then/rb ''/'' ./.\n");
  PrepareArgs a = p.args("out");
  a.brown = brown;
  ASSERT_EQ(prepare(a), 0);
  const ShardMeta m = read_meta(a.out);
  EXPECT_EQ(m.train.documents, 1u);
  EXPECT_EQ(m.val.documents, 1u);
  const text::Tokenizer tok = text::Tokenizer::from_json(tiny_tokenizer_json(), "tiny");
  std::vector<uint32_t> both = read_split(a.out, m.train, 50), val = read_split(a.out, m.val, 50);
  both.insert(both.end(), val.begin(), val.end());
  std::vector<uint32_t> a0 = tok.encode("He said \"then.\"\n"), b0 = tok.encode("The other.\n");
  a0.push_back(258), b0.push_back(258);
  EXPECT_TRUE(
      both ==
          [&] {
            auto v = a0;
            v.insert(v.end(), b0.begin(), b0.end());
            return v;
          }() ||
      both ==
          [&] {
            auto v = b0;
            v.insert(v.end(), a0.begin(), a0.end());
            return v;
          }());
  remove_tree(a.out);
  remove_tree(brown);
}

// Interrupted after its second shard, prepare leaves neither --out nor its temporary folder.
TEST(Prepare, SignalLeavesNothing) {
  Prepared p("prep_signal");
  const std::vector<std::string> inputs = p.write_inputs();
  const PrepareArgs a = [&] {
    PrepareArgs b = p.args("out");
    b.inputs = inputs;
    b.shard_tokens = 10;
    b.threads = 1;
    return b;
  }();
  for (int sig : {SIGTERM, SIGINT}) {
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {  // (one thread: the parent's OpenMP pool does not survive the fork)
      close(ready[0]);
      remove_temporaries_on_signals();
      int shards = 0;
      prepare_tuning.after_shard = [&] {
        if (++shards == 2) {
          (void)!write(ready[1], "x", 1);
          for (;;) pause();
        }
      };
      try {
        prepare(a);
      } catch (...) {
      }
      _exit(3);
    }
    close(ready[1]);
    char c;
    const bool paused = read(ready[0], &c, 1) == 1;  // EOF if the child ended instead
    close(ready[0]);
    if (!paused) kill(child, SIGKILL), waitpid(child, nullptr, 0);
    ASSERT_TRUE(paused);
    const std::string tmp = a.out + ".tmp." + std::to_string(child);
    int shards = 0;
    for (const std::string& n : list_dir(tmp)) shards += n.size() > 4 && n.ends_with(".bin");
    EXPECT_EQ(shards, 2);
    kill(child, sig);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << status;
    EXPECT_FALSE(exists(tmp)) << list_dir(tmp).size() << " files left";
    EXPECT_FALSE(exists(a.out));
  }
}

}  // namespace
}  // namespace tq::data
