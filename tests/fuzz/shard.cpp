// A token shard and a shard folder's meta.json: the input is read as a shard (vocabulary of
// 1000) and, written into a folder, as that folder's meta.json. Each a value, or tq::Error.
#include "data/shard.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/common.h"
#include "fuzz_input.h"

namespace {

struct Folder {
  std::string dir;
  Folder() {
    char tmpl[] = "/tmp/tq-fuzz-shard.XXXXXX";
    if (!mkdtemp(tmpl)) std::abort();
    dir = tmpl;
  }
  ~Folder() {  // at the fuzzer's exit
    unlink((dir + "/meta.json").c_str());
    rmdir(dir.c_str());
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tq::fuzz::InputFile in("shard");
  static const Folder folder;
  const std::string path = in.write(data, size) + "";
  try {
    const tq::data::Shard s(path, 1000);
    unsigned sum = 0;
    for (size_t i = 0; i < s.size(); ++i) sum += s.ids()[i];
    tq::fuzz::sink = sum;
  } catch (const tq::Error&) {
  }
  std::FILE* f = std::fopen((folder.dir + "/meta.json").c_str(), "wb");
  if (!f || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) std::abort();
  try {
    const tq::data::ShardMeta m = tq::data::read_meta(folder.dir);
    tq::fuzz::sink = unsigned(m.train.shards.size() + m.val.shards.size() + m.command.size());
  } catch (const tq::Error&) {
  }
  return 0;
}
