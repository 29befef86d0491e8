// The all-reduce a data-parallel step runs, alone: MPI_Iallreduce (dist::ArrayComm, as the
// trainer starts it) of fp32 arrays from 1 MiB to the size given, each timed over repeats after
// a warm-up, under mpirun. Prints per size the mean milliseconds, the bus bandwidth (nccl-tests'
// busbw: 2 (N-1)/N x bytes / time, what a ring moves over each rank's link), and the ring
// model's time from the link measured in the same run: one ring step (every rank sends S/N
// bytes to the next and receives S/N from the previous, MPI_Isend/Irecv) timed, times the
// ring's 2 (N-1) steps (docs/performance.md: data-parallel training).
// usage: mpirun -np N tq_allreduce_bench [MAX_MIB]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "dist/group.h"
#include "model/ops.h"
// the C API only, as src/dist/group_mpi.cpp
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

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
  if (g.rank() == 0)
    std::printf("%10s %10s %12s %12s %10s %12s\n", "MiB", "ms", "algbw GB/s", "busbw GB/s",
                "model ms", "link GB/s");
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
    // one ring step: S/N bytes to the next rank, S/N from the previous (best of the repeats)
    const int size = g.size(), next = (g.rank() + 1) % size, prev = (g.rank() + size - 1) % size;
    const size_t chunk = n / size_t(size);
    std::vector<float> in(chunk);
    double step = 1e30;
    for (int r = -1; r < reps; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      MPI_Request q[2];
      MPI_Irecv(in.data(), int(chunk), MPI_FLOAT, prev, 1, MPI_COMM_WORLD, &q[0]);
      MPI_Isend(x.data(), int(chunk), MPI_FLOAT, next, 1, MPI_COMM_WORLD, &q[1]);
      MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
      double t =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (r >= 0) step = std::min(step, t);
    }
    const double bytes = double(n) * 4;
    if (g.rank() == 0)
      std::printf("%10zu %10.2f %12.2f %12.2f %10.2f %12.2f\n", mib, ms, bytes / ms * 1e-6,
                  bytes * 2 * (N - 1) / N / ms * 1e-6, 2 * (N - 1) * step,
                  double(chunk) * 4 / step * 1e-6);
  }
  return 0;
}
