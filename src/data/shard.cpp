#include "data/shard.h"

#include <dirent.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "core/common.h"
#include "io/file.h"

namespace tq::data {

// The header and ids are read and written as the host's integers.
static_assert(std::endian::native == std::endian::little, "shards are little-endian");

namespace {

const char* const kRemake = "make it with tiny-qwen3 prepare";

void check_count(uint64_t n) {
  if (n > kMaxShardTokens)
    throw Error("a token shard holds at most " + std::to_string(kMaxShardTokens) + " tokens, not " +
                std::to_string(n) + ": use a smaller --shard-tokens");
}

}  // namespace

ShardWriter::ShardWriter(const std::string& path) : file_(std::make_unique<AtomicFile>(path)) {
  int32_t header[kShardHeaderInts] = {kShardMagic, kShardVersion, 0};
  file_->write(header, sizeof header);
}
ShardWriter::~ShardWriter() = default;
void ShardWriter::append(const uint32_t* ids, size_t n) {
  check_count(n_ + n);
  file_->write(ids, n * sizeof(uint32_t));
  n_ += n;
}
void ShardWriter::commit() {
  const int32_t count = static_cast<int32_t>(n_);
  file_->patch(2 * sizeof(int32_t), &count, sizeof count);
  file_->commit();
}

void write_shard(const std::string& path, const uint32_t* ids, size_t n) {
  check_count(n);
  ShardWriter w(path);
  w.append(ids, n);
  w.commit();
}

Shard::Shard(const std::string& path, uint32_t vocab_size)
    : file_(std::make_unique<MappedFile>(path)) {
  const uint8_t* p = file_->data();
  const size_t size = file_->size();
  int32_t h[3] = {};
  if (size) std::memcpy(h, p, std::min(size, sizeof h));
  // The magic first: a file that is no shard at all is told so, whatever its size.
  if (size >= 4 && h[0] != kShardMagic)
    throw Error(path + " is not a token shard (magic " + std::to_string(h[0]) + ", want " +
                std::to_string(kShardMagic) + "): " + kRemake);
  if (size < kShardHeaderBytes)
    throw Error(path + " is truncated: " + std::to_string(size) +
                " bytes, shorter than a token shard's " + std::to_string(kShardHeaderBytes) +
                "-byte header: " + kRemake);
  if (h[1] != kShardVersion)
    throw Error(path + " is a token shard of version " + std::to_string(h[1]) + ", want " +
                std::to_string(kShardVersion) + " (llm.c's uint32 ids): " + kRemake);
  if (h[2] < 0)
    throw Error(path + " has a negative token count (" + std::to_string(h[2]) + "): " + kRemake);
  const uint64_t want = uint64_t(h[2]) * 4, have = size - kShardHeaderBytes;
  if (have < want)
    throw Error(path + " is truncated: its header says " + std::to_string(h[2]) + " tokens (" +
                std::to_string(want) + " bytes), but " + std::to_string(have) +
                " bytes follow it: " + kRemake + " again");
  if (have > want)
    throw Error(path + " has " + std::to_string(have - want) + " bytes past its " +
                std::to_string(h[2]) + " tokens: " + kRemake + " again");
  n_ = size_t(h[2]);
  // The mapping is page-aligned and the header 1024 bytes, so the ids are aligned.
  ids_ = reinterpret_cast<const uint32_t*>(p + kShardHeaderBytes);
  // A chunk's maximum vectorizes; only a chunk with a bad id is searched for its first one.
  constexpr size_t kChunk = 1 << 16;
  for (size_t at = 0; at < n_; at += kChunk) {
    const size_t end = std::min(n_, at + kChunk);
    uint32_t top = 0;
    for (size_t i = at; i < end; ++i) top = std::max(top, ids_[i]);
    if (top < vocab_size) continue;
    for (size_t i = at; i < end; ++i)
      if (ids_[i] >= vocab_size)
        throw Error(path + ": token " + std::to_string(i) + " is id " + std::to_string(ids_[i]) +
                    ", past the vocabulary of " + std::to_string(vocab_size) +
                    ": make the shards with this model's tokenizer");
  }
}
Shard::~Shard() = default;
Shard::Shard(Shard&&) noexcept = default;
Shard& Shard::operator=(Shard&&) noexcept = default;
const std::string& Shard::path() const {
  return file_->path();
}

std::string shard_name(const std::string& split, uint64_t index) {
  char b[32];
  std::snprintf(b, sizeof b, "_%06llu.bin", static_cast<unsigned long long>(index));
  return split + b;
}

namespace {

// The index of NAME if it is SPLIT_NNNNNN.bin as shard_name writes it (six digits, more only
// without a leading zero), else -1.
int64_t shard_index(const std::string& name, const std::string& split) {
  const size_t pre = split.size() + 1, suf = 4;
  if (name.size() < pre + 6 + suf || name.compare(0, split.size(), split) != 0 ||
      name[split.size()] != '_' || name.compare(name.size() - suf, suf, ".bin") != 0)
    return -1;
  const std::string digits = name.substr(pre, name.size() - pre - suf);
  if (digits.size() > 18 || (digits.size() > 6 && digits[0] == '0')) return -1;
  int64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

}  // namespace

std::vector<std::string> list_shards(const std::string& dir, const std::string& split) {
  if (split != "train" && split != "val")
    throw Error("internal: unknown split '" + split + "' (train or val)");
  DIR* d = opendir(dir.c_str());
  if (!d) throw Error("cannot open folder " + dir + ": " + std::strerror(errno));
  std::map<int64_t, std::string> found;  // by index: 1000000 sorts after 999999
  while (const dirent* e = readdir(d)) {
    const int64_t i = shard_index(e->d_name, split);
    if (i >= 0) found[i] = e->d_name;
  }
  closedir(d);
  if (found.empty())
    throw Error(dir + " has no " + split + " shards (" + shard_name(split, 0) +
                ", ...): make them with tiny-qwen3 prepare");
  std::vector<std::string> paths;
  for (const auto& [i, name] : found) {
    if (i != int64_t(paths.size()))
      throw Error(dir + " has " + name + " but no " + shard_name(split, paths.size()) +
                  ": make the folder again with tiny-qwen3 prepare");
    paths.push_back(dir + "/" + name);
  }
  return paths;
}

// ---- meta.json

using ojson = nlohmann::ordered_json;

std::string meta_json(const ShardMeta& m) {
  auto split = [](const SplitMeta& s) {
    return ojson{{"documents", s.documents}, {"tokens", s.tokens}, {"shards", s.shards}};
  };
  const ojson j = {
      {"format", kMetaFormat},
      {"version", kMetaVersion},
      {"tokenizer",
       {{"path", m.tokenizer_path},
        {"sha256", m.tokenizer_sha256},
        {"vocab_size", m.vocab_size},
        {"eos_id", m.eos_id}}},
      {"splits", {{"train", split(m.train)}, {"val", split(m.val)}}},
      {"val_fraction", m.val_fraction},
      {"seed", m.seed},
      {"shard_tokens", m.shard_tokens},
      {"command", m.command},
  };
  // (replace: a command line is not always UTF-8)
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void write_meta(const std::string& dir, const ShardMeta& m) {
  const std::string s = meta_json(m);
  AtomicFile f(dir + "/meta.json");
  f.write(s.data(), s.size());
  f.commit();
}

namespace {

using json = nlohmann::json;

// Reads meta.json's fields, each failure one line naming the file and the field.
struct MetaReader {
  std::string path;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(path + ": " + what + ": make the folder again with tiny-qwen3 prepare");
  }
  // A value as it reads in the file, short, on one line (JSON escapes any newline).
  static std::string shown(const json& v) {
    std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
    return s.size() > 60 ? s.substr(0, 57) + "..." : s;
  }
  const json& field(const json& obj, const char* key, const std::string& name) const {
    const auto it = obj.find(key);
    if (it == obj.end()) fail("no field \"" + name + "\"");
    return *it;
  }
  const json& object(const json& obj, const char* key, const std::string& name) const {
    const json& v = field(obj, key, name);
    if (!v.is_object()) fail("\"" + name + "\" must be an object, not " + shown(v));
    return v;
  }
  std::string string(const json& obj, const char* key, const std::string& name) const {
    const json& v = field(obj, key, name);
    if (!v.is_string()) fail("\"" + name + "\" must be a string, not " + shown(v));
    return v.get<std::string>();
  }
  uint64_t whole(const json& obj, const char* key, const std::string& name, uint64_t lo,
                 uint64_t hi) const {
    const json& v = field(obj, key, name);
    if (!v.is_number_unsigned() || v.get<uint64_t>() < lo || v.get<uint64_t>() > hi)
      fail("\"" + name + "\" must be a whole number in " + std::to_string(lo) + ".." +
           std::to_string(hi) + ", not " + shown(v));
    return v.get<uint64_t>();
  }
  SplitMeta split(const json& splits, const char* key, uint64_t shard_tokens) const {
    const std::string name = std::string("splits.") + key;
    const json& o = object(splits, key, name);
    constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
    SplitMeta s;
    s.documents = whole(o, "documents", name + ".documents", 0, kMax);
    s.tokens = whole(o, "tokens", name + ".tokens", 0, kMax);
    const json& shards = field(o, "shards", name + ".shards");
    if (!shards.is_array()) fail("\"" + name + ".shards\" must be a list, not " + shown(shards));
    // Plain names of this split only, as prepare writes them: nothing outside the folder.
    for (const json& v : shards) {
      if (!v.is_string()) fail("\"" + name + ".shards\" must hold file names, not " + shown(v));
      const std::string want = shard_name(key, s.shards.size());
      if (v.get<std::string>() != want)
        fail("\"" + name + ".shards\" holds " + shown(v) + " where " + want + " belongs");
      s.shards.push_back(want);
    }
    const uint64_t count = s.tokens / shard_tokens + (s.tokens % shard_tokens != 0);
    if (s.shards.size() != count)
      fail("\"" + name + "\" has " + std::to_string(s.tokens) + " tokens, which fill " +
           std::to_string(count) + " shards of " + std::to_string(shard_tokens) + ", not " +
           std::to_string(s.shards.size()));
    if (s.tokens > 0 && s.documents == 0)
      fail("\"" + name + "\" has " + std::to_string(s.tokens) + " tokens but no documents");
    return s;
  }
};

}  // namespace

ShardMeta read_meta(const std::string& dir) {
  MetaReader r{dir + "/meta.json"};
  const MappedFile f(r.path);
  const char* p = reinterpret_cast<const char*>(f.data());
  json j;
  try {
    j = json::parse(p, p + f.size());
  } catch (const json::parse_error& e) {
    r.fail("not JSON (at byte " + std::to_string(e.byte) + ")");
  } catch (const json::exception&) {  // out_of_range: a number past a double's range
    r.fail("not JSON that can be read (a number out of range)");
  }
  if (!j.is_object()) r.fail("not a JSON object");
  const auto fmt = j.find("format");
  if (fmt == j.end() || !fmt->is_string() || *fmt != kMetaFormat)
    throw Error(r.path + " is not a tiny-qwen3 shard folder's meta.json (\"format\" is " +
                (fmt == j.end() ? std::string("missing") : MetaReader::shown(*fmt)) + ", want \"" +
                kMetaFormat + "\"): make the folder with tiny-qwen3 prepare");
  const json& version = r.field(j, "version", "version");
  if (!version.is_number_unsigned() || version.get<uint64_t>() != uint64_t(kMetaVersion))
    throw Error(r.path + " is of version " + MetaReader::shown(version) + ", this tiny-qwen3 " +
                "reads version " + std::to_string(kMetaVersion) +
                ": make the folder again with this tiny-qwen3's prepare");
  ShardMeta m;
  const json& tok = r.object(j, "tokenizer", "tokenizer");
  m.tokenizer_path = r.string(tok, "path", "tokenizer.path");
  if (m.tokenizer_path.empty() || m.tokenizer_path[0] != '/')
    r.fail("\"tokenizer.path\" must be an absolute path, not " + MetaReader::shown(tok["path"]));
  m.tokenizer_sha256 = r.string(tok, "sha256", "tokenizer.sha256");
  if (m.tokenizer_sha256.size() != 64 ||
      m.tokenizer_sha256.find_first_not_of("0123456789abcdef") != std::string::npos)
    r.fail("\"tokenizer.sha256\" must be 64 lowercase hex digits, not " +
           MetaReader::shown(tok["sha256"]));
  m.vocab_size = uint32_t(r.whole(tok, "vocab_size", "tokenizer.vocab_size", 1, UINT32_MAX));
  m.eos_id = uint32_t(r.whole(tok, "eos_id", "tokenizer.eos_id", 0, m.vocab_size - 1));
  const json& vf = r.field(j, "val_fraction", "val_fraction");
  if (!vf.is_number() || !(vf.get<double>() >= 0 && vf.get<double>() < 1))
    r.fail("\"val_fraction\" must be a number in [0, 1), not " + MetaReader::shown(vf));
  m.val_fraction = vf.get<double>();
  m.seed = r.whole(j, "seed", "seed", 0, std::numeric_limits<uint64_t>::max());
  m.shard_tokens = r.whole(j, "shard_tokens", "shard_tokens", 1, kMaxShardTokens);
  m.command = r.string(j, "command", "command");
  const json& splits = r.object(j, "splits", "splits");
  m.train = r.split(splits, "train", m.shard_tokens);
  m.val = r.split(splits, "val", m.shard_tokens);
  return m;
}

}  // namespace tq::data
