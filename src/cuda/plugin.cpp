// Builds with the CUDA toolkit: the backend lives in libtq_cuda.so (src/cuda/ops.cu, cuBLAS
// and the CUDA runtime inside it), loaded here on the first --backend cuda call, so that CPU
// runs of the same binary never map the CUDA libraries (~150 MiB of RSS otherwise).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/common.h"
#include "cuda/ops.h"

namespace tq {
namespace {

std::string exe_dir() {
  std::string buf(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return ".";
  buf.resize(size_t(n));
  const size_t slash = buf.rfind('/');
  return slash == std::string::npos ? "." : buf.substr(0, slash);
}

// TQ_CUDA_LIB if set, else next to the binary, or one folder up (build/tests/tq_tests).
const CudaPlugin& plugin() {
  static const CudaPlugin* loaded = nullptr;
  if (loaded) return *loaded;
  std::vector<std::string> paths;
  if (const char* env = std::getenv("TQ_CUDA_LIB"); env && *env)
    paths.push_back(env);
  else
    paths = {exe_dir() + "/libtq_cuda.so", exe_dir() + "/../libtq_cuda.so"};
  for (const std::string& path : paths) {
    if (access(path.c_str(), F_OK) != 0) continue;
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) throw Error("the CUDA backend " + path + " does not load: " + dlerror());
    auto entry = reinterpret_cast<const CudaPlugin* (*)()>(dlsym(h, "tq_cuda_plugin"));
    if (!entry) throw Error(path + " is not a tiny-qwen3 CUDA backend (no tq_cuda_plugin)");
    const CudaPlugin* p = entry();
    if (p->version != kCudaPluginVersion)
      throw Error(path + " is from another build (plugin version " + std::to_string(p->version) +
                  ", this binary wants " + std::to_string(kCudaPluginVersion) + "): rebuild both");
    return *(loaded = p);
  }
  if (paths.size() == 1) throw Error("TQ_CUDA_LIB=" + paths[0] + ": no such file");
  throw Error("the CUDA backend libtq_cuda.so is not next to this binary (" + paths.front() +
              "): keep it with tiny-qwen3, or point TQ_CUDA_LIB at it");
}

}  // namespace

bool cuda_built() {
  return true;
}
CudaDevice cuda_device(int id) {
  return plugin().device(id);
}
const Ops& cuda_ops() {
  return plugin().ops();
}
const CudaCollectives& cuda_collectives() {
  return *plugin().collectives();
}

}  // namespace tq
