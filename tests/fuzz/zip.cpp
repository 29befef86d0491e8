// The zip container of torch.save files (io/zip.h) on any bytes: every entry listed and each
// record's CRC-32 checked, or tq::Error.
#include "io/zip.h"

#include <cstddef>
#include <cstdint>

#include "core/common.h"
#include "fuzz_input.h"
#include "io/file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tq::fuzz::InputFile in("zip");
  try {
    tq::MappedFile f(in.write(data, size));
    tq::ZipReader z(f);
    z.verify_crcs();
    unsigned sum = 0;  // each record's first and last byte: inside the mapping, or a report
    for (const std::string& name : z.names()) {
      const tq::ZipEntry& e = z.entry(name);
      if (e.size) sum += z.data(e)[0] + z.data(e)[e.size - 1];
    }
    tq::fuzz::sink = sum;
  } catch (const tq::Error&) {
  }
  return 0;
}
