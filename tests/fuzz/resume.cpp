// A checkpoint through the path `train --resume` takes (train/checkpoint.h): the run
// configuration read back flag by flag, then the step counts, the shards' identity, the
// scheduler's and loader's state and every fp32 tensor of the model and AdamW's moments,
// checked and read by pieces as into debugmodel's arenas. A resumable state, or tq::Error.
#include <cstddef>
#include <cstdint>

#include "core/common.h"
#include "fuzz_input.h"
#include "model/config.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tq::fuzz::InputFile in("resume");
  const tq::Config& c = tq::preset("debugmodel");
  const tq::ParamSink ignore = [](size_t, const float*, size_t) {};
  tq::data::ShardMeta meta;  // the seeds' shards (tests/fuzz/make_seeds.py)
  meta.tokenizer_sha256 = "ab";
  meta.train.tokens = 1000, meta.val.tokens = 100;
  try {
    const std::string& path = in.write(data, size);
    const tq::train::RunConfig rc = tq::train::read_run_config(path);
    tq::train::load_run(path, c, rc, meta, ignore, ignore, ignore);
  } catch (const tq::Error&) {
  }
  return 0;
}
