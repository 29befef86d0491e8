// The CUDA backend's ArrayComm: NCCL's all-reduce and broadcasts on device memory, enqueued on
// the backend's stream (the CUDA plugin's CudaCollectives, src/cuda/ops.cu). MPI only sends
// rank 0's NCCL id to the others: the arrays themselves never cross to the host, NCCL moves them
// between the GPUs (NVLink, PCIe, the network). Compiled in every build; without CUDA,
// cuda_collectives() says there is no backend.
#include <cstdio>
#include <exception>
#include <string>

#include "core/common.h"
#include "cuda/ops.h"
#include "dist/group.h"

namespace tq::dist {

namespace {

class NcclArrays final : public ArrayComm {
 public:
  NcclArrays(Group& g, const CudaCollectives& c, void* comm) : g_(g), c_(c), comm_(comm) {}
  ~NcclArrays() override {
    // work started and never waited for (an error ended the step): the other ranks may never
    // join it, and a destroy would wait for it
    if (pending_) c_.abort(comm_);
    c_.destroy(comm_);
  }
  void start_allreduce(float* p, size_t n) override {
    if (n == 0) return;
    c_.allreduce_sum(comm_, p, n);
    pending_ = true;
  }
  void start_allgather(void* p, const std::vector<size_t>& off) override {
    if (off.size() != size_t(g_.size()) + 1)
      throw Error("NCCL all-gather: " + std::to_string(off.size()) + " offsets for " +
                  std::to_string(g_.size()) + " ranks");
    c_.allgather(comm_, p, off.data(), g_.size());
    pending_ = true;
  }
  void progress() override {}  // NCCL's kernels and proxy thread go on by themselves
  // `done` polled against the deadline (Group::wait_until); on a failure or a job that ends,
  // the communicator is aborted first
  void wait(const char* what) override {
    if (!pending_) return;
    g_.wait_until(
        [&] {
          try {
            return c_.done(comm_) != 0;
          } catch (const std::exception& e) {
            const std::string m = e.what();  // "NCCL: ..." or "CUDA: ..." (the plugin's errors)
            std::fprintf(stderr, "error: rank %d: NCCL: %s (%s)\n", g_.rank(),
                         m.c_str() + (m.rfind("NCCL: ", 0) == 0 ? 6 : 0), what);
            c_.abort(comm_);
            g_.abort(1);
          }
        },
        what, [&] { c_.abort(comm_); });
    pending_ = false;
  }

 private:
  Group& g_;
  const CudaCollectives& c_;
  void* comm_;
  bool pending_ = false;
};

}  // namespace

// Every rank of g, each on its own GPU (cuda_device made it current): rank 0's unique id, sent
// by MPI, then the communicator (ncclCommInitRank waits for every rank).
std::unique_ptr<ArrayComm> nccl_array_comm(Group& g) {
  const CudaCollectives& c = cuda_collectives();
  char id[128] = {};
  if (g.rank() == 0) c.unique_id(id);
  g.broadcast(id, sizeof id, 0, "NCCL's id");
  return std::make_unique<NcclArrays>(g, c, c.init(id, g.rank(), g.size()));
}

}  // namespace tq::dist
