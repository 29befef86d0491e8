// A profiling backend: the same kernel table with every kernel timed (wall clock, the calls
// return when the work is done on the CPU backend) and its work counted from its sizes.
// `train --profile` prints where a step's time goes; model code is unchanged.
#pragma once
#include <string>
#include <vector>

#include "model/ops.h"

namespace tq {

// flops and bytes: what the calls must do at least, summed: the products' and attention's
// arithmetic (attention by the causal count: the query-key pairs the mask lets through; zero
// for the other kernels), and every kernel's memory traffic with each operand read and each
// result written once. Against the machine's peak and copy rate they are a kernel's floor.
struct KernelTime {
  std::string name;
  double seconds;
  long calls;
  double flops = 0, bytes = 0;
};

const Ops& profiled(const Ops& inner);   // one profiled backend per process
std::vector<KernelTime> kernel_times();  // since the last reset, largest first
void reset_kernel_times();

}  // namespace tq
