// A Hugging Face folder through the whole import path: its config.json (input's first byte
// even) beside fixed small weights, or its model.safetensors.index.json (odd) beside fixed
// shards and config.json. A weights file, or tq::Error.
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/common.h"
#include "io/model_file.h"

namespace {

void put(const std::string& path, const void* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) std::abort();
}
void put(const std::string& path, const std::string& s) {
  put(path, s.data(), s.size());
}
// A safetensors file of F32 tensors named `names`, each of 4 values.
std::string shard(std::initializer_list<const char*> names) {
  std::string hdr = "{", data;
  size_t at = 0;
  for (const char* n : names) {
    if (hdr.size() > 1) hdr += ",";
    hdr += std::string("\"") + n + "\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[" +
           std::to_string(at) + "," + std::to_string(at + 16) + "]}";
    at += 16;
  }
  hdr += "}";
  hdr.append((8 - hdr.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((hdr.size() >> (8 * i)) & 0xff);
  return out + hdr + std::string(at, '\0');
}

struct Folders {
  std::string weights, sharded;  // config.json fuzzed; the index fuzzed
  Folders() {
    char tmpl[] = "/tmp/tq-fuzz-hf.XXXXXX";
    const char* root = mkdtemp(tmpl);
    if (!root) std::abort();
    weights = std::string(root) + "/w";
    sharded = std::string(root) + "/s";
    if (mkdir(weights.c_str(), 0700) || mkdir(sharded.c_str(), 0700)) std::abort();
    put(weights + "/model.safetensors", shard({"model.norm.weight", "lm_head.weight"}));
    put(sharded + "/model-00001-of-00002.safetensors", shard({"model.norm.weight"}));
    put(sharded + "/model-00002-of-00002.safetensors", shard({"model.embed_tokens.weight"}));
    put(sharded + "/config.json", "{\"model_type\": \"qwen3\", \"hidden_size\": 4}");
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Folders dirs;
  if (size == 0) return 0;
  const bool index = data[0] & 1;
  const std::string dir = index ? dirs.sharded : dirs.weights;
  put(dir + (index ? "/model.safetensors.index.json" : "/config.json"), data + 1, size - 1);
  try {
    tq::load_checkpoint(dir);
  } catch (const tq::Error&) {
  }
  return 0;
}
