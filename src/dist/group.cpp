// What every build has: the launch read from mpirun's environment, and the ranks' ranges.
#include "dist/group.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "model/ops.h"

namespace tq::dist {

namespace {
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return *end == '\0' && x >= 0 && x < (1 << 24) ? int(x) : fallback;
}
}  // namespace

Launch launched() {
  Launch l;
  // OpenMPI's mpirun; PMI_* (MPICH's mpiexec, Slurm's srun) where it is not
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) {
    l.size = env_int("OMPI_COMM_WORLD_SIZE", 1), l.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    l.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
    l.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
  } else if (std::getenv("PMI_SIZE")) {
    l.size = env_int("PMI_SIZE", 1), l.rank = env_int("PMI_RANK", 0);
    l.local_size = env_int("MPI_LOCALNRANKS", 1), l.local_rank = env_int("MPI_LOCALRANKID", 0);
  }
  if (l.size < 1) l.size = 1;
  return l;
}

void Group::wait_until(const std::function<bool()>& done, const char* what,
                       const std::function<void()>& on_end) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  // Each test moves the transfer on (MPI's shared memory goes in fragments, one a test), so a
  // wait first polls back to back, yielding the core where another process wants it; after a
  // second it sleeps between tests (a rank that is late or gone).
  for (;;) {
    if (done()) return;
    const auto now = clock::now();
    if (signal_ && (*signal_ == SIGTERM || *signal_ == SIGINT) && !signalled_) {
      signalled_ = true;
      signalled_at_ = now;
    }
    if (signalled_ && now - signalled_at_ > std::chrono::seconds(5)) {
      const int sig = *signal_;
      std::fprintf(stderr,
                   "error: rank %d: ended by %s while waiting for the other ranks (%s): a rank "
                   "has stopped, and mpirun ends the job; the last checkpoint stays loadable\n",
                   rank_, strsignal(sig), what);
      if (on_end) on_end();
      std::fflush(stderr);
      std::_Exit(128 + sig);
    }
    const double waited = std::chrono::duration<double>(now - t0).count();
    if (waited > timeout_) {
      std::fprintf(stderr,
                   "error: rank %d: no answer from the other ranks in %g s (%s): a rank died or "
                   "hangs, so the job ends (--timeout sets the wait); the last checkpoint stays "
                   "loadable\n",
                   rank_, timeout_, what);
      if (on_end) on_end();
      abort(1);
    }
    if (waited < 1)
      sched_yield();
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::vector<size_t> split_ranges(size_t n, int size, size_t align) {
  std::vector<size_t> off(size_t(size) + 1, n);
  const size_t each = ((n + size_t(size) - 1) / size_t(size) + align - 1) / align * align;
  for (int r = 0; r < size; ++r) off[size_t(r)] = std::min(n, size_t(r) * each);
  return off;
}

// group_mpi.cpp or group_none.cpp; nccl.cpp
std::unique_ptr<ArrayComm> host_array_comm(Group& g);
std::unique_ptr<ArrayComm> nccl_array_comm(Group& g);

std::unique_ptr<ArrayComm> array_comm(Group& g, const Ops& ops) {
  return ops.name.rfind("cuda", 0) == 0 ? nccl_array_comm(g) : host_array_comm(g);
}

}  // namespace tq::dist
