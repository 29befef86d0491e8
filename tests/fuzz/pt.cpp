// A .pt file through the whole path `check` and `--init-from` take (io/model_file.h): the zip,
// every CRC-32, the pickle, the state dict's names, shapes and dtypes against the presets, and
// the weights read by pieces. A weights file, or tq::Error.
#include <cstddef>
#include <cstdint>

#include "core/common.h"
#include "fuzz_input.h"
#include "io/model_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tq::fuzz::InputFile in("pt");
  try {
    tq::load_checkpoint(in.write(data, size));
  } catch (const tq::Error&) {
  }
  return 0;
}
