// The CUDA backend (src/cuda/ops.cu): the kernel table of model/ops.h on an NVIDIA GPU.
// Builds without the CUDA toolkit get src/cuda/none.cpp, whose functions say so.
#pragma once
#include <cstddef>
#include <string>

#include "model/ops.h"

namespace tq {

struct CudaDevice {
  int id;
  std::string name;              // "NVIDIA H200"
  int sm;                        // 90 for sm_90
  size_t total, free;            // bytes of device memory
  std::string describe() const;  // "CUDA(id=0, NVIDIA H200, sm_90, 139 GiB)"
};

bool cuda_built();  // this binary has the CUDA backend
// Device `id`, made current; Error (one line: no driver, no device, id out of range) if not.
CudaDevice cuda_device(int id);
// The kernel table on the current device (cuda_device first). Pointers are device memory;
// upload/download cross to the host.
const Ops& cuda_ops();

}  // namespace tq
