#include "io/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
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

// The open temporaries, read by a signal handler: fixed C strings, each published by its flag
// (set after the name is written, cleared once the file is renamed or removed).
namespace {
struct Temporary {
  std::atomic<bool> used{false};
  bool folder = false;  // rmdir (after every file), not unlink
  char path[4096];
};
constexpr int kTemporaries = 8;
Temporary g_temps[kTemporaries];
static_assert(std::atomic<bool>::is_always_lock_free);

int list_temporary(const std::string& tmp, bool folder = false) {  // (from one thread)
  if (tmp.size() >= sizeof g_temps[0].path) return -1;
  for (int i = 0; i < kTemporaries; ++i)
    if (!g_temps[i].used.load()) {
      std::memcpy(g_temps[i].path, tmp.c_str(), tmp.size() + 1);
      g_temps[i].folder = folder;
      g_temps[i].used.store(true);
      return i;
    }
  return -1;  // not listed: a signal would leave this one behind
}
void unlist_temporary(int slot) {
  if (slot >= 0) g_temps[slot].used.store(false);
}
void on_signal(int sig) {
  remove_temporaries();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}
}  // namespace

void remove_temporaries() {
  for (Temporary& t : g_temps)
    if (t.used.load() && !t.folder) ::unlink(t.path);
  for (Temporary& t : g_temps)
    if (t.used.load() && t.folder) ::rmdir(t.path);
}
void remove_temporaries_on_signals() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction now;  // a signal ignored from the start stays so (nohup, `cmd &`)
    if (sigaction(sig, nullptr, &now) == 0 && now.sa_handler != SIG_IGN)
      std::signal(sig, on_signal);
  }
}

AtomicFile::AtomicFile(const std::string& path)
    : path_(path), tmp_(path + ".tmp." + std::to_string(getpid())) {
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) throw Error("cannot create " + tmp_ + ": " + std::strerror(errno));
  slot_ = list_temporary(tmp_);
}
AtomicFile::~AtomicFile() {
  if (f_) std::fclose(f_);
  if (f_ || synced_) std::remove(tmp_.c_str());
  unlist_temporary(slot_);
}
void AtomicFile::write(const void* p, size_t n) {
  if (n && std::fwrite(p, 1, n, f_) != n)
    throw Error("writing " + tmp_ + " failed: " + std::strerror(errno) + " (disk full?)");
  offset_ += n;
}
void AtomicFile::write_fill(uint64_t n, const Fill& fill, const std::string& what,
                            const ByteSink& seen) {
  uint64_t done = 0;
  fill([&](const void* p, size_t m) {
    if (m > n - done)
      throw Error("internal: " + what + " has more than its " + std::to_string(n) + " bytes");
    if (seen) seen(p, m);
    write(p, m);
    done += m;
  });
  if (done != n)
    throw Error("internal: " + what + " has " + std::to_string(done) + " of its " +
                std::to_string(n) + " bytes");
}
void AtomicFile::patch(uint64_t at, const void* p, size_t n) {
  if (!f_ || at + n > offset_)
    throw Error("internal: patching " + tmp_ + (f_ ? " past what was written" : " after its sync"));
  if (fseeko(f_, off_t(at), SEEK_SET) != 0 || std::fwrite(p, 1, n, f_) != n ||
      fseeko(f_, 0, SEEK_END) != 0)
    throw Error("writing " + tmp_ + " failed: " + std::strerror(errno) + " (disk full?)");
}
void AtomicFile::sync() {
  if (!f_) return;
  if (std::fflush(f_) != 0 || fsync(fileno(f_)) != 0)
    throw Error("writing " + tmp_ + " failed: " + std::strerror(errno) + " (disk full?)");
  std::fclose(f_);
  f_ = nullptr;
  synced_ = true;
}
void AtomicFile::commit() {
  sync();
  if (!synced_) throw Error("internal: " + path_ + " committed twice");
  synced_ = false;
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp_.c_str());
    throw Error("cannot rename " + tmp_ + " to " + path_ + ": " + why);
  }
  unlist_temporary(slot_);
  slot_ = -1;
  const size_t slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash + 1);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) fsync(dfd), ::close(dfd);
}

TemporaryFolder::TemporaryFolder(const std::string& path)
    : path_(path), slot_(list_temporary(path, true)) {}
TemporaryFolder::~TemporaryFolder() {
  if (path_.empty()) return;
  unlist_temporary(slot_);
  ::rmdir(path_.c_str());
}
void TemporaryFolder::keep() {
  unlist_temporary(slot_);
  slot_ = -1;
  path_.clear();
}

}  // namespace tq
