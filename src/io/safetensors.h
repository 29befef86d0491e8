// safetensors (spec pytorch-checkpoint.md §4): a validating reader over a mapped file and
// a streaming writer. Layout: u64 LE header length N, N bytes of JSON, then the tensors.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/file.h"

namespace tq {

struct StTensor {
  std::string name, dtype;  // dtype as in the file: "F32", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data buffer, end exclusive
};

size_t st_dtype_size(const std::string& dtype);  // 0 for a string the format does not know

class SafetensorsFile {
 public:
  // Validates the whole header: JSON object, known dtypes, unique names, byte lengths that
  // match dtype x shape, tensors tiling the buffer exactly (no gap, overlap or tail).
  explicit SafetensorsFile(const std::string& path);
  const std::vector<StTensor>& tensors() const { return tensors_; }  // by offset
  const StTensor* find(const std::string& name) const;
  const uint8_t* data(const StTensor& t) const { return buffer_ + t.begin; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  const uint8_t* buffer_ = nullptr;
  std::vector<StTensor> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// True if the file starts like a safetensors file (a plausible length, then '{').
bool looks_like_safetensors(const uint8_t* data, size_t size);

struct StOutTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  Fill fill;  // emits the tensor's bytes, in order, when saved (written as they come)
};
// Writes atomically, in the reference writer's order (element size descending, then name)
// with the header padded to 8 bytes so every tensor is naturally aligned.
void save_safetensors(const std::string& path, std::vector<StOutTensor> tensors,
                      const std::map<std::string, std::string>& metadata);
// The same bytes into f, not committed (several files made whole together: export_hf).
void write_safetensors(AtomicFile& f, std::vector<StOutTensor> tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace tq
