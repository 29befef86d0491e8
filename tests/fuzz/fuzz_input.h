// What the fuzz targets share: the project's readers take paths (they map their files), so an
// input is written to an in-memory file first.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace tq::fuzz {

// An in-memory file (memfd) holding data, and the path that opens it. One per process,
// rewritten by each input.
class InputFile {
 public:
  explicit InputFile(const char* name) {
    fd_ = memfd_create(name, 0);
    if (fd_ < 0) std::abort();
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  const std::string& write(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0 || pwrite(fd_, data, size, 0) != ssize_t(size)) std::abort();
    return path_;
  }

 private:
  int fd_ = -1;
  std::string path_;
};

// Where a target leaves bytes it read, so that the reads are not optimized away.
inline volatile unsigned sink = 0;

}  // namespace tq::fuzz
