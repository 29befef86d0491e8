// What every build has: the launch read from mpirun's environment, and the ranks' ranges.
#include "dist/group.h"

#include <algorithm>
#include <cstdlib>
#include <string>

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
