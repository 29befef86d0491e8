// A text run's checkpoint: the PyTorch .pt every run writes (io/checkpoint.h) with TorchTitan's
// pieces of training state beside the model, so that `train --resume` continues the run bit
// for bit (docs/formats.md):
//   "model"         the fp32 master weights (the state dict, TorchTitan's names)
//   "optimizer"     torch.optim's state dict flattened as TorchTitan saves it:
//                   "state.<fqn>.exp_avg" / "exp_avg_sq" / "step" (AdamW; SGD has none) and
//                   "param_groups.<fqn>.lr" / "betas" / ... for every parameter
//   "lr_scheduler"  LambdaLR's state dict: last_epoch = the steps taken
//   "data"          where the loader continues: epoch, position (windows taken in the epoch),
//                   tokens seen, and the shards it reads (their tokenizer and sizes)
//   "rng"           the generator the loader shuffles with (seeded per epoch: seed and epoch)
//   "run"           the whole run configuration, a value per flag ("batch_size": 8, ...)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/shard.h"
#include "io/checkpoint.h"
#include "model/init.h"
#include "train/trainer.h"

namespace tq::train {

// One flag of the run configuration: its name, how it reads as text (exact: doubles as %.17g),
// and whether a resumed run may change it (logging, saving, where the same shards lie, and
// --steps, which may only grow).
struct ConfigField {
  const char* flag;  // "--batch-size"
  enum Kind { Int, Real, Text } kind;
  bool resumable;
  std::string (*get)(const RunConfig&);
  void (*set)(RunConfig&, const std::string&);
};
const std::vector<ConfigField>& config_fields();

// Where the run stands after `step` optimizer steps.
struct TrainState {
  int64_t step = 0;
  uint64_t epoch = 0, position = 0;  // the loader's next window
  uint64_t tokens = 0;               // trained on so far
  std::vector<double> losses;        // every step's
};

// The optimizer's arenas (fp32, make_layout order, in the backend's memory), read while the
// file is written; m and v are empty for SGD.
struct OptimizerArenas {
  ParamReader master, m, v;
};

// Writes it atomically. rec: the record every checkpoint has (final_loss: the fixed batch's).
void save_run(const std::string& path, const Config& c, const RunConfig& rc,
              const data::ShardMeta& meta, const OptimizerArenas& a, const TrainState& st,
              const TrainRecord& rec);

// The shards a text run's checkpoint recorded having trained on ("data"): their tokenizer's
// SHA-256, its vocabulary size and end-of-text id.
struct RunShards {
  std::string tokenizer_sha256;
  uint32_t vocab_size = 0, eos_id = 0;
};

// The recorded configuration of the run `path` continues (Error if it is not a text run's
// checkpoint or its configuration is damaged); with `shards`, also what it recorded of them.
RunConfig read_run_config(const std::string& path, RunShards* shards = nullptr);

// Restores the weights, the optimizer's moments and the state, handing each arena's values to
// master, m and v by pieces (m and v unused for SGD), after checking the file against rc (its
// preset, optimizer, step counts) and the shards against meta: Error naming what differs.
TrainState load_run(const std::string& path, const Config& c, const RunConfig& rc,
                    const data::ShardMeta& meta, const ParamSink& master, const ParamSink& m,
                    const ParamSink& v);

}  // namespace tq::train
