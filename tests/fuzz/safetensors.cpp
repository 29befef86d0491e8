// A .safetensors file through the reader's header checks and the whole import path (as
// pt.cpp): a weights file, or tq::Error.
#include "io/safetensors.h"

#include <cstddef>
#include <cstdint>

#include "core/common.h"
#include "fuzz_input.h"
#include "io/model_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tq::fuzz::InputFile in("safetensors");
  const std::string path = in.write(data, size) + "";
  try {
    tq::SafetensorsFile f(path);
    unsigned sum = 0;  // each tensor's first and last byte
    for (const tq::StTensor& t : f.tensors())
      if (t.end > t.begin) sum += f.data(t)[0] + f.data(t)[t.end - t.begin - 1];
    tq::fuzz::sink = sum;
  } catch (const tq::Error&) {
  }
  try {
    tq::load_checkpoint(path);
  } catch (const tq::Error&) {
  }
  return 0;
}
