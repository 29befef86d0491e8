// The process group of a build without MPI: this process alone; a launch by mpirun of more
// than one rank is refused with what to install.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/common.h"
#include "dist/group.h"

namespace tq::dist {

Group& Group::world() {
  static Group* g = [] {
    if (launched().size > 1)
      throw Error(
          "this build has no MPI, so it cannot run as one of several ranks: install "
          "libopenmpi-dev (bash tools/deps.sh) and rebuild");
    return new Group();
  }();
  return *g;
}

Group::~Group() = default;

void Group::abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

bool Group::test_requests(void*, int) {
  return true;
}
void Group::wait_requests(void*, int, const char*) {}
void Group::barrier(const char*) {}
void Group::broadcast(void*, size_t, int, const char*) {}
void Group::allgather(const void* in, void* out, size_t bytes, const char*) {
  std::memcpy(out, in, bytes);
}
void Group::gather_ranges(const float* mine, float* all, const std::vector<size_t>& off, int,
                          const char*) {
  std::memcpy(all + off[0], mine, (off[1] - off[0]) * sizeof(float));
}

std::unique_ptr<ArrayComm> host_array_comm(Group&) {
  throw Error("this build has no MPI: the CPU backend's collectives need libopenmpi-dev");
}

}  // namespace tq::dist
