#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "core/common.h"

namespace tq {

using nlohmann::json;

size_t st_dtype_size(const std::string& d) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

namespace {

constexpr uint64_t kMaxHeader = 100000000;  // the reference implementation's limit
constexpr int kMaxDepth = 4;                // {"name": {"shape": [..]}} is 3 deep

uint64_t read_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Nesting depth outside strings; bounds what the JSON parser will be asked to build.
int max_depth(const char* s, size_t n) {
  int depth = 0, worst = 0;
  bool in_str = false;
  for (size_t i = 0; i < n; ++i) {
    const char c = s[i];
    if (in_str) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      worst = std::max(worst, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return worst;
}

uint64_t as_u64(const json& v, const std::string& where) {
  if (!v.is_number_unsigned()) throw Error(where + " must be a non-negative integer");
  return v.get<uint64_t>();
}

}  // namespace

bool looks_like_safetensors(const uint8_t* d, size_t n) {
  if (n < 10) return false;
  const uint64_t h = read_u64(d);
  return h >= 2 && h <= kMaxHeader && h <= n - 8 && d[8] == '{';
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const std::string where = path + ": ";
  const uint8_t* d = file_.data();
  const uint64_t size = file_.size();
  if (size < 8)
    throw Error(where + "too short for a safetensors file (" + std::to_string(size) + " bytes)");
  const uint64_t n = read_u64(d);
  if (n > kMaxHeader)
    throw Error(where + "safetensors header length " + std::to_string(n) + " exceeds the limit " +
                std::to_string(kMaxHeader) + " (not a safetensors file?)");
  if (n > size - 8)
    throw Error(where + "header length " + std::to_string(n) + " runs past the end of the " +
                std::to_string(size) + "-byte file (truncated?)");
  const char* h = reinterpret_cast<const char*>(d + 8);
  if (n == 0 || h[0] != '{') throw Error(where + "safetensors header does not start with '{'");
  if (max_depth(h, n) > kMaxDepth) throw Error(where + "safetensors header is nested too deeply");
  // Duplicate keys: nlohmann keeps the last silently; the format forbids them.
  std::vector<std::set<std::string>> seen;
  std::string dup;
  auto cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) seen.emplace_back();
    if (ev == json::parse_event_t::object_end && !seen.empty()) seen.pop_back();
    if (ev == json::parse_event_t::key && !seen.empty() &&
        !seen.back().insert(parsed.get<std::string>()).second && dup.empty())
      dup = parsed.get<std::string>();
    return true;
  };
  json hdr;
  try {
    hdr = json::parse(h, h + n, cb);
  } catch (const json::exception& e) {
    throw Error(where + "safetensors header is not valid JSON: " + e.what());
  }
  if (!dup.empty()) throw Error(where + "safetensors header repeats the key '" + dup + "'");
  if (!hdr.is_object()) throw Error(where + "safetensors header is not a JSON object");
  const uint64_t buf_size = size - 8 - n;
  buffer_ = d + 8 + n;
  for (auto& [name, info] : hdr.items()) {
    const std::string at = where + "tensor '" + name + "': ";
    if (name == "__metadata__") {
      if (!info.is_object()) throw Error(where + "__metadata__ is not an object");
      for (auto& [k, v] : info.items()) {
        if (!v.is_string())
          throw Error(where + "__metadata__ value of '" + k + "' is not a string");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    if (!info.is_object()) throw Error(at + "entry is not an object");
    for (auto& [k, v] : info.items())
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        throw Error(at + "unknown field '" + k + "'");
    if (!info.contains("dtype") || !info["dtype"].is_string()) throw Error(at + "no dtype string");
    if (!info.contains("shape") || !info["shape"].is_array()) throw Error(at + "no shape list");
    if (!info.contains("data_offsets") || !info["data_offsets"].is_array() ||
        info["data_offsets"].size() != 2)
      throw Error(at + "data_offsets must be [begin, end]");
    StTensor t;
    t.name = name;
    t.dtype = info["dtype"].get<std::string>();
    const size_t es = st_dtype_size(t.dtype);
    if (!es) throw Error(at + "unknown dtype '" + t.dtype + "'");
    uint64_t numel = 1;
    for (const json& s : info["shape"]) {
      const uint64_t dim = as_u64(s, at + "shape entries");
      if (dim > uint64_t(INT64_MAX) || (dim && numel > UINT64_MAX / dim))
        throw Error(at + "shape overflows");
      numel *= dim;
      t.shape.push_back(int64_t(dim));
    }
    t.begin = as_u64(info["data_offsets"][0], at + "data_offsets");
    t.end = as_u64(info["data_offsets"][1], at + "data_offsets");
    if (t.begin > t.end) throw Error(at + "data_offsets begin after end");
    if (numel > UINT64_MAX / es || t.end - t.begin != numel * es)
      throw Error(at + std::to_string(t.end - t.begin) + " bytes, but " + t.dtype + " " +
                  "of its shape needs " + std::to_string(numel) + " x " + std::to_string(es));
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const StTensor& a, const StTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  for (const StTensor& t : tensors_) {
    if (t.begin != cursor)
      throw Error(where + "tensor '" + t.name + "' starts at byte " + std::to_string(t.begin) +
                  ", expected " + std::to_string(cursor) +
                  (t.begin < cursor ? " (overlaps the previous tensor)" : " (gap before it)"));
    cursor = t.end;
  }
  if (cursor != buf_size)
    throw Error(where + "tensors cover " + std::to_string(cursor) +
                " bytes but the data buffer has " + std::to_string(buf_size) +
                (cursor > buf_size ? " (truncated?)" : " (trailing bytes)"));
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

const StTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void save_safetensors(const std::string& path, std::vector<StOutTensor> tensors,
                      const std::map<std::string, std::string>& metadata) {
  AtomicFile f(path);
  write_safetensors(f, std::move(tensors), metadata);
  f.commit();
}
void write_safetensors(AtomicFile& f, std::vector<StOutTensor> tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::stable_sort(tensors.begin(), tensors.end(), [](const StOutTensor& a, const StOutTensor& b) {
    const size_t sa = st_dtype_size(a.dtype), sb = st_dtype_size(b.dtype);
    return sa != sb ? sa > sb : a.name < b.name;
  });
  nlohmann::ordered_json hdr = nlohmann::ordered_json::object();
  if (!metadata.empty()) hdr["__metadata__"] = metadata;
  uint64_t off = 0;
  std::vector<uint64_t> sizes;
  for (const StOutTensor& t : tensors) {
    const size_t es = st_dtype_size(t.dtype);
    if (!es) throw Error("safetensors: unknown dtype " + t.dtype);
    if (hdr.contains(t.name)) throw Error("safetensors: duplicate tensor name " + t.name);
    uint64_t n = es;
    for (int64_t s : t.shape) n *= uint64_t(s);
    hdr[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    sizes.push_back(n);
    off += n;
  }
  std::string h = hdr.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(h.size()) >> (8 * i));
  f.write(len, 8);
  f.write(h.data(), h.size());
  for (size_t i = 0; i < tensors.size(); ++i)
    f.write_fill(sizes[i], tensors[i].fill, "safetensors tensor " + tensors[i].name);
}

}  // namespace tq
