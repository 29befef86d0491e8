// A Hugging Face folder through the whole import path: its config.json (input's first byte
// even) beside fixed small weights, or its model.safetensors.index.json (odd) beside fixed
// shards and config.json. A weights file, or tq::Error.
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/common.h"
#include "io/model_file.h"
#include "io/safetensors.h"

namespace {

void put(const std::string& path, const void* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) std::abort();
}
void put(const std::string& path, const std::string& s) {
  put(path, s.data(), s.size());
}
// A safetensors file of F32 tensors named `names`, each of 4 zeros, by the project's writer.
void shard(const std::string& path, std::initializer_list<const char*> names) {
  std::vector<tq::StOutTensor> ts;
  for (const char* n : names)
    ts.push_back({n, "F32", {4}, [](const tq::ByteSink& emit) {
                    const float zeros[4] = {};
                    emit(zeros, sizeof zeros);
                  }});
  tq::save_safetensors(path, std::move(ts), {});
}

struct Folders {
  std::string root, weights, sharded;  // config.json fuzzed; the index fuzzed
  Folders() {
    char tmpl[] = "/tmp/tq-fuzz-hf.XXXXXX";
    if (!mkdtemp(tmpl)) std::abort();
    root = tmpl;
    weights = root + "/w";
    sharded = root + "/s";
    if (mkdir(weights.c_str(), 0700) || mkdir(sharded.c_str(), 0700)) std::abort();
    shard(weights + "/model.safetensors", {"model.norm.weight", "lm_head.weight"});
    shard(sharded + "/model-00001-of-00002.safetensors", {"model.norm.weight"});
    shard(sharded + "/model-00002-of-00002.safetensors", {"model.embed_tokens.weight"});
    put(sharded + "/config.json", "{\"model_type\": \"qwen3\", \"hidden_size\": 4}");
  }
  ~Folders() {  // at the fuzzer's exit
    for (const std::string& f :
         {weights + "/model.safetensors", weights + "/config.json",
          sharded + "/model-00001-of-00002.safetensors",
          sharded + "/model-00002-of-00002.safetensors", sharded + "/config.json",
          sharded + "/model.safetensors.index.json"})
      unlink(f.c_str());
    rmdir(weights.c_str());
    rmdir(sharded.c_str());
    rmdir(root.c_str());
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
