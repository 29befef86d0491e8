// The all-reduce a data-parallel step runs, alone: MPI_Iallreduce (dist::ArrayComm, as the
// trainer starts it) of fp32 arrays from 1 MiB to the size given, each timed over repeats after
// a warm-up, under mpirun. Prints per size the mean milliseconds and the bus bandwidth
// (nccl-tests' busbw: 2 (N-1)/N x bytes / time, what a ring moves over each rank's link), to
// set against the ring model in docs/performance.md.
// usage: mpirun -np N tq_allreduce_bench [MAX_MIB]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "dist/group.h"
#include "model/ops.h"

int main(int argc, char** argv) {
  using namespace tq;
  dist::Group& g = dist::Group::world();
  const size_t max_mib = argc > 1 ? size_t(std::atol(argv[1])) : 128;
  if (!g.distributed()) {
    std::fprintf(stderr, "run it under mpirun with 2 or more ranks\n");
    return 2;
  }
  const auto comm = dist::array_comm(g, cpu_ops());
  const double N = g.size();
  if (g.rank() == 0) std::printf("%10s %10s %12s %12s\n", "MiB", "ms", "algbw GB/s", "busbw GB/s");
  for (size_t mib = 1; mib <= max_mib; mib *= 2) {
    const size_t n = mib << 18;
    std::vector<float> x(n, 1.0f);
    const int reps = int(std::clamp<size_t>(256 / mib, 3, 50));
    double ms = 0;
    for (int r = -1; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      comm->start_allreduce(x.data(), n);
      comm->wait("the bench's all-reduce");
      if (r >= 0)
        ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count();
    }
    ms /= reps;
    const double bytes = double(n) * 4;
    if (g.rank() == 0)
      std::printf("%10zu %10.2f %12.2f %12.2f\n", mib, ms, bytes / ms * 1e-6,
                  bytes * 2 * (N - 1) / N / ms * 1e-6);
  }
  return 0;
}
