// The ZIP container of PyTorch checkpoints (spec pytorch-checkpoint.md §1): stored entries,
// data 64-byte aligned, ZIP64 when anything reaches 0xFFFFFFFF.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/file.h"

namespace tq {

class ZipWriter {
 public:
  explicit ZipWriter(AtomicFile& out) : out_(out) {}
  void add(const std::string& name, const void* data, uint64_t n);  // one stored entry
  // The same from n bytes that fill emits by pieces, each written as it comes: no copy of the
  // whole record is held (its CRC-32 is patched into the header after). Error if fill emits
  // other than n bytes.
  void add(const std::string& name, uint64_t n, const Fill& fill);
  void finish();  // central directory and end records

 private:
  struct Entry {
    std::string name;
    uint32_t crc;
    uint64_t size, offset;
  };
  AtomicFile& out_;
  std::vector<Entry> entries_;
};

struct ZipEntry {
  uint64_t offset;  // of the first data byte in the file
  uint64_t size;
  uint32_t crc;  // CRC-32 from the central directory (0: not recorded)
};

// Parses the central directory of a mapped file; every entry is bounds-checked.
class ZipReader {
 public:
  explicit ZipReader(const MappedFile& f);
  const std::vector<std::string>& names() const { return order_; }
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  const ZipEntry& entry(const std::string& name) const;  // Error if absent
  const uint8_t* data(const ZipEntry& e) const { return file_.data() + e.offset; }
  // Every record's data against its CRC-32 (Error naming the first that differs). torch never
  // checks them (its miniz is built without reader CRC checks): a flipped bit in a weight would
  // load as a wrong weight. A stored 0 counts as not recorded: torch 2.x writes 0 under
  // torch.serialization.set_crc32_options(False).
  void verify_crcs() const;

 private:
  const MappedFile& file_;
  std::map<std::string, ZipEntry> entries_;
  std::vector<std::string> order_;
};

uint32_t crc32_of(const void* data, uint64_t n);

}  // namespace tq
