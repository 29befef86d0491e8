// Builds without the CUDA toolkit: the backend is absent and says how to get it.
#include "core/common.h"
#include "cuda/ops.h"

namespace tq {

bool cuda_built() {
  return false;
}
CudaDevice cuda_device(int) {
  throw Error(
      "this build has no CUDA backend: configure it where nvcc is found (CUDA toolkit at "
      "/usr/local/cuda, or set CMAKE_CUDA_COMPILER) and rebuild");
}
const Ops& cuda_ops() {
  throw Error("this build has no CUDA backend");
}
const CudaCollectives& cuda_collectives() {
  throw Error("this build has no CUDA backend: NCCL's collectives come with it");
}

}  // namespace tq
