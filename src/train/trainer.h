// Training on token shards: batches from a split (train/data.h), micro-batches accumulated,
// the global gradient norm clipped, AdamW or SGD on fp32 master weights (train/optimizer.h) at
// TorchTitan's schedule (train/schedule.h), validation on fixed windows of the val split, a
// line per step and a JSONL record (train/metrics.h).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "core/common.h"
#include "model/ops.h"
#include "train/data.h"
#include "train/optimizer.h"
#include "train/schedule.h"

namespace tq {
struct ModelFile;
namespace cpu {
class ThreadGovernor;
}
}  // namespace tq

namespace tq::train {

struct RunConfig {
  std::string preset = "debugmodel";
  DType dtype = DType::bf16;
  int64_t B = 1, T = 32, steps = 20, seed = 0;
  std::string output, init_from;
  // data
  std::string data;  // a folder from `prepare`
  DataOrder order = DataOrder::sequential;
  AttentionMask attention = AttentionMask::causal;  // block-causal: documents end at meta's eos
  int64_t grad_accum = 1;
  // data parallel (docs/distributed.md): the job's ranks (mpirun's processes), each taking
  // grad_accum micro-batches of B a step, so the global batch is B * grad_accum * ranks; with
  // shard_optimizer each rank keeps 1/ranks of the master weights and AdamW's moments (ZeRO-1);
  // timeout: the seconds a collective waits for the other ranks
  int64_t ranks = 1;
  bool shard_optimizer = false;
  double timeout = 300;
  // optimizer and schedule
  OptimizerKind optimizer = OptimizerKind::adamw;
  double lr = 8e-4;
  AdamWConfig adamw;
  int64_t warmup = 2;
  std::optional<double> decay_ratio = 0.8;
  DecayType decay_type = DecayType::linear;
  double lr_min = 0;
  double max_norm = 1.0;  // 0: no clipping
  // validation and output
  int64_t val_every = 0, val_tokens = 0;
  int64_t log_every = 1;
  std::string metrics;  // a JSONL file, or ""
  // checkpoints: every save_every steps (0: at the end only) to `output`, a file (overwritten)
  // or a folder (step-NNNNNNNN.pt, the newest `keep` kept; 0: all)
  int64_t save_every = 0, keep = 0;
  int64_t stop_after = 0;  // stop after this step, resumable (0: run to the end)
  std::string resume;      // the checkpoint this run continues, or ""
  // samples: every sample_every steps (0: none), each prompt's greedy continuation of
  // sample_tokens tokens (what the model writes, for the eye; not recorded by checkpoints)
  int64_t sample_every = 0, sample_tokens = 32;
  std::vector<std::string> prompts;
};

// `output` names a folder (it ends in '/' or is one): checkpoints go in it by step.
bool output_is_folder(const std::string& output);
// Where the checkpoint after `step` steps goes.
std::string checkpoint_path(const std::string& output, int64_t step);

// The bytes the optimizer holds besides the model's arenas, in the backend's memory: fp32
// master weights, the accumulated gradient, a micro-batch's gradient (with --grad-accum above
// 1), and AdamW's two moments; with shard_optimizer, this rank's share of the master weights
// and moments.
size_t optimizer_bytes(const RunConfig& rc, size_t params);

// The end every training run shares: the thread summary, the checkpoint written by save (to
// `output`, or NAME.FAILED.pt when `failure` says why the run failed), and `training: ok`
// (returns 0) or `training: FAILED: <failure>` (returns 1).
int finish_run(const cpu::ThreadGovernor* governor, const std::string& output,
               const std::string& failure, const std::function<void(const std::string&)>& save);

// The exit code of a run stopped by --stop-after (a signal's is 128 + its number): it saved
// a checkpoint to resume from.
constexpr int kStoppedEarly = 3;

// Runs it (or continues rc.resume's run); prints as it goes; returns the exit code: 0, 1 for
// `training: FAILED`, kStoppedEarly or 128 + a signal's number when stopped early.
int run(const RunConfig& rc, const Ops& ops, const std::optional<ModelFile>& init,
        cpu::ThreadGovernor* governor);

}  // namespace tq::train
