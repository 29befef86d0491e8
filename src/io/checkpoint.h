// tiny-qwen3 checkpoints: real PyTorch .pt files (zip + pickle protocol 2).
// {"model": state_dict (TorchTitan's split-qkv key names, tied weight stored once),
//  "config": {"preset", "seq_len", "seed"}, "steps", "learning_rate", "initial_loss",
//  "final_loss", "dtype" (the run's), "losses", "format"[, "init_from"]}; a text run's also
// holds its fp32 master weights as "model" and the state to resume from (train/checkpoint.h).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/common.h"
#include "io/file.h"
#include "io/pickle.h"
#include "io/zip.h"
#include "model/config.h"

namespace tq {

constexpr const char* kCheckpointFormat = "tiny-qwen3/1";

// Low level: collects storages, then writes data.pkl and one record per storage.
class PtWriter {
 public:
  // A storage of numel elements of `storage` class; fill emits its bytes, in order, when saved
  // (each piece written as it comes: no copy of a whole tensor is held).
  TensorRef add_storage(const std::string& storage, int64_t numel, Fill fill);
  void save(const std::string& path, const Value& root);  // atomic

 private:
  struct Pending {
    std::string key, storage;
    int64_t numel;
    Fill fill;
  };
  std::vector<Pending> storages_;
};

// Contiguous view of a whole storage with the given shape.
TensorRef full_view(TensorRef storage, std::vector<int64_t> shape);

struct TrainRecord {
  int64_t seq_len = 0, seed = 0, steps = 0;
  double learning_rate = 0, initial_loss = 0, final_loss = 0;
  std::vector<double> losses;
  std::string init_from;  // the file the weights started from, if not the seed
};

// One entry of TorchTitan's state_dict() (spec §8) and where it lives in the arena.
struct StateEntry {
  std::string key;
  std::vector<int64_t> shape;
  size_t offset;   // arena offset; for wq/wk/wv that of the fused wqkv
  int64_t slot0;   // wq/wk/wv: first slot in each kv group of the fused rows; -1 otherwise
  int64_t slots;   // wq/wk/wv: slots per group (G for q, 1 for k and v)
  bool tied_copy;  // lm_head.weight of a tied preset: the tok_embeddings tensor again
};
std::vector<StateEntry> state_dict_entries(const Config& cfg, const ParamLayout& layout);

// Where entry e's dense tensor lies in the arena: runs of n elements from arena offset
// `arena` to dense offset `dense`. The q/k/v entries are slots of every kv group (spec §3).
struct ArenaRun {
  size_t arena, dense, n;
};
std::vector<ArenaRun> entry_runs(const Config& cfg, const StateEntry& e);

// Reads arena elements [off, off+n) as fp32 into out; called while the file is written,
// one tensor at a time, so no full copy of the model is needed.
using ParamReader = std::function<void(size_t off, size_t n, float* out)>;
// Entry e's dense tensor, read from the arena by pieces of at most kEncodePiece values,
// encoded in dtype and emitted piece by piece, in order.
constexpr size_t kEncodePiece = size_t(1) << 22;
void encode_entry(const ByteSink& emit, const Config& cfg, const StateEntry& e,
                  const ParamReader& read, DType dtype);
// The state dict of the parameters (arena in make_layout order) in the given dtype.
ValuePtr state_dict(PtWriter& w, const Config& cfg, const ParamLayout& layout,
                    const ParamReader& read, DType dtype);
// The checkpoint's root dict (the model in `dtype` and the record), storages added to w: a
// text run adds its optimizer and loader state to it before w.save (train/checkpoint.h).
ValuePtr checkpoint_root(PtWriter& w, const Config& cfg, const ParamReader& read, DType dtype,
                         const TrainRecord& rec, DType compute_dtype);
void save_checkpoint(const std::string& path, const Config& cfg, const ParamReader& read,
                     DType dtype, const TrainRecord& rec);
// The same from a whole fp32 arena params[layout.total].
ParamReader arena_reader(const float* params);

std::string shape_str(const std::vector<int64_t>& shape);  // "[2048, 256]"
// Where a failed run's checkpoint goes: tiny-qwen3.pt -> tiny-qwen3.FAILED.pt
std::string failed_name(const std::string& path);

// Any torch.save zip file: validated container, unpickled root, bounds-checked tensors.
class PtReader {
 public:
  // Error naming what is wrong; verify_crcs: every record against its CRC-32 first (off: the
  // parser's own checks alone, for tests that fuzz it)
  explicit PtReader(const std::string& path, bool verify_crcs = true);
  // Dense fp32 copy of tensor value v (named `name` in messages), which must have `shape`.
  std::vector<float> tensor(const std::string& name, const Value* v,
                            const std::vector<int64_t>& shape) const;
  // Its elements [begin, begin + count) in dense (row-major) order, into out.
  void tensor(const std::string& name, const Value* v, const std::vector<int64_t>& shape,
              size_t begin, size_t count, float* out) const;

  MappedFile file;
  ZipReader zip;
  std::string prefix;  // the archive folder, e.g. "archive/"
  ValuePtr root;

  // Error naming legacy/foreign formats unless f starts like a zip.
  static const MappedFile& check_magic(const MappedFile& f);
};

}  // namespace tq
