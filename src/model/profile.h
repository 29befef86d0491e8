// A profiling backend: the same kernel table with every kernel timed (wall clock, the calls
// return when the work is done on the CPU backend). `train --profile` prints where a step's
// time goes; model code is unchanged.
#pragma once
#include <string>
#include <vector>

#include "model/ops.h"

namespace tq {

struct KernelTime {
  std::string name;
  double seconds;
  long calls;
};

const Ops& profiled(const Ops& inner);   // one profiled backend per process
std::vector<KernelTime> kernel_times();  // since the last reset, largest first
void reset_kernel_times();

}  // namespace tq
