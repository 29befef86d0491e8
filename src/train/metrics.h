// What a run reports: a line per step for the user, and a JSONL record per step and per
// validation for tools (`--metrics FILE.jsonl`).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace tq::train {

struct StepMetrics {
  int64_t step = 0, steps = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  uint64_t tokens = 0;  // trained on so far
  double ms = 0, tokens_per_s = 0;
  // a data-parallel run's: the step's milliseconds spent waiting for the other ranks (the
  // all-reduce the backward did not hide, ZeRO-1's gather, a slower rank); -1: one process
  double comm_ms = -1;
};

// "step   12/200 | loss 5.123456 | lr 7.60e-04 | grad norm 1.2345 | 4,321 tok/s | 118.5 ms"
// (data parallel: "... | 118.5 ms | comm 9.1 ms")
std::string step_line(const StepMetrics& m);

// Appends one JSON object a line, flushed as written (a run stopped mid-way keeps its lines).
class MetricsLog {
 public:
  // "" writes nothing; Error if it cannot open. resume_after > 0: a resumed run's, which keeps
  // the file's records of steps up to that one (a run killed after its last checkpoint wrote
  // more) and appends.
  explicit MetricsLog(const std::string& path, int64_t resume_after = 0);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void step(const StepMetrics& m);
  void validation(int64_t step, uint64_t tokens, double val_loss, uint64_t val_tokens);

 private:
  void line(const std::string& json);
  FILE* f_ = nullptr;
  std::string path_;
};

}  // namespace tq::train
