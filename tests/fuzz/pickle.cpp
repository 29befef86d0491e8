// The pickle unpickler (io/pickle.h) on any bytes: a value, or tq::Error.
#include "io/pickle.h"

#include <cstddef>
#include <cstdint>

#include "core/common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    tq::pickle_loads(data, size);
  } catch (const tq::Error&) {
  }
  return 0;
}
