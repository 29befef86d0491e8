// Files: read-only mapping with bounds-checked access, and atomic writes
// (temporary name, fsync, rename) so a crash never leaves a half-written file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace tq {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // Error if missing/unreadable
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A tensor's or record's bytes, produced in order by pieces: fill(emit) calls emit(p, n) for
// each piece, which the writer writes as it comes (no copy of the whole is held).
using ByteSink = std::function<void(const void*, size_t)>;
using Fill = std::function<void(const ByteSink&)>;

// While open, the temporary's name is also listed for remove_temporaries().
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);  // opens path + ".tmp.<pid>"
  ~AtomicFile();                                 // removes the temporary unless committed
  void write(const void* p, size_t n);           // Error on a short write (disk full)
  // Writes the n bytes that fill emits, each piece as it comes (seen, if set, is shown each
  // piece first); Error naming `what` if fill emits other than n bytes.
  void write_fill(uint64_t n, const Fill& fill, const std::string& what,
                  const ByteSink& seen = nullptr);
  // Overwrites n bytes written earlier at offset `at` (a zip record's CRC-32, known only once
  // its data is written); the next write appends as before.
  void patch(uint64_t at, const void* p, size_t n);
  uint64_t offset() const { return offset_; }
  void sync();    // flush and fsync the temporary (still listed, not yet renamed)
  void commit();  // sync, rename over path, fsync the folder

 private:
  std::string path_, tmp_;
  FILE* f_ = nullptr;
  uint64_t offset_ = 0;
  int slot_ = -1;        // in the list of temporaries, or -1
  bool synced_ = false;  // closed and synced, not yet renamed
};

// A folder this process created for files it has not finished: removed (if empty) with the
// temporaries, and by the destructor unless kept.
class TemporaryFolder {
 public:
  explicit TemporaryFolder(const std::string& path);  // lists path (which must exist)
  ~TemporaryFolder();                                 // rmdir unless kept
  void keep();

 private:
  std::string path_;
  int slot_ = -1;
};
// Removes every AtomicFile temporary this process has open, then its empty temporary folders;
// async-signal-safe.
void remove_temporaries();
// SIGINT, SIGTERM and SIGHUP then remove the temporaries and end the process as the signal
// would have (an interrupted save of an 8 GB checkpoint left 8 GB under NAME.tmp.PID).
void remove_temporaries_on_signals();

}  // namespace tq
