#include "io/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/common.h"

namespace tq {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error("cannot open " + path + ": " + std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + " is not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw Error("cannot map " + path + ": " + std::strerror(errno));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}
MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<uint8_t*>(data_), size_);
}

AtomicFile::AtomicFile(const std::string& path)
    : path_(path), tmp_(path + ".tmp." + std::to_string(getpid())) {
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) throw Error("cannot create " + tmp_ + ": " + std::strerror(errno));
}
AtomicFile::~AtomicFile() {
  if (f_) {
    std::fclose(f_);
    std::remove(tmp_.c_str());
  }
}
void AtomicFile::write(const void* p, size_t n) {
  if (n && std::fwrite(p, 1, n, f_) != n)
    throw Error("writing " + tmp_ + " failed: " + std::strerror(errno) + " (disk full?)");
  offset_ += n;
}
void AtomicFile::commit() {
  if (std::fflush(f_) != 0 || fsync(fileno(f_)) != 0)
    throw Error("writing " + tmp_ + " failed: " + std::strerror(errno) + " (disk full?)");
  std::fclose(f_);
  f_ = nullptr;
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp_.c_str());
    throw Error("cannot rename " + tmp_ + " to " + path_ + ": " + why);
  }
  const size_t slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash + 1);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) fsync(dfd), ::close(dfd);
}

}  // namespace tq
