// The CUDA backend (src/cuda/ops.cu): the kernel table of model/ops.h on an NVIDIA GPU.
// Builds without the CUDA toolkit get src/cuda/none.cpp, whose functions say so.
#pragma once
#include <cstddef>
#include <string>

#include "model/ops.h"

namespace tq {

struct CudaDevice {
  int id;
  std::string name;               // "NVIDIA H200"
  int sm;                         // 90 for sm_90
  size_t total, free;             // bytes of device memory
  std::string describe() const {  // "CUDA(id=0, NVIDIA H200, sm_90, 139 GiB)"
    return "CUDA(id=" + std::to_string(id) + ", " + name + ", sm_" + std::to_string(sm) + ", " +
           std::to_string((total + (size_t(1) << 29)) >> 30) + " GiB)";
  }
};

bool cuda_built();  // this binary has the CUDA backend
// Device `id`, made current; Error (one line: no driver, no device, id out of range, the
// backend's library missing) if not.
CudaDevice cuda_device(int id);
// The kernel table on the current device (cuda_device first). Pointers are device memory;
// upload/download cross to the host.
const Ops& cuda_ops();

// NCCL's collectives on device arrays, for data-parallel runs (src/dist/nccl.cpp): one
// communicator of `size` ranks made from rank 0's unique id (which MPI sends), its operations
// enqueued on the backend's stream (after the kernels queued so far). init binds the
// communicator to the current device (cuda_device first).
struct CudaCollectives {
  void (*unique_id)(char id[128]);                        // ncclGetUniqueId (NCCL_UNIQUE_ID_BYTES)
  void* (*init)(const char* id, int rank, int size);      // ncclCommInitRank; Error on failure
  void (*allreduce_sum)(void* comm, float* p, size_t n);  // in place, fp32 sum
  // rank r's bytes [off[r], off[r+1]) of p to every rank, in place: one ncclBroadcast per rank
  // inside ncclGroupStart/End (ranges may differ in size)
  void (*allgather)(void* comm, void* p, const size_t* off, int size);
  // 1 where everything enqueued so far has finished, 0 while not; Error (NCCL's message) where
  // the communicator or the stream failed
  int (*done)(void* comm);
  void (*abort)(void* comm);    // ncclCommAbort: for a job that is ending (a rank died)
  void (*destroy)(void* comm);  // ncclCommDestroy after finishing; frees comm (also after abort)
};
const CudaCollectives& cuda_collectives();

// The backend is a plugin, libtq_cuda.so next to the binary (src/cuda/plugin.cpp loads it on
// the first call above): CPU runs never map the CUDA libraries. Its one exported symbol:
struct CudaPlugin {
  int version;  // kCudaPluginVersion of the build that made it
  CudaDevice (*device)(int id);
  const Ops& (*ops)();
  const CudaCollectives* (*collectives)();
};
constexpr int kCudaPluginVersion = 8;  // bump with any change to Ops, CudaDevice or this
extern "C" const CudaPlugin* tq_cuda_plugin();

}  // namespace tq
