// Which kernel set the products run on: decided once from the CPU and TQ_CPU (gemm.h).
#include "cpu/gemm.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace tq::cpu {
namespace {

const char* requested() {
  const char* e = std::getenv("TQ_CPU");
  return e ? e : "";
}

#ifdef TQ_NO_X86_KERNELS
bool cpu_avx2() {
  return false;
}
bool cpu_avx512() {
  return false;
}
bool cpu_avx512bf16() {
  return false;
}
#else
bool cpu_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}
bool cpu_avx512() {
  return cpu_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
bool cpu_avx512bf16() {
  return cpu_avx512() && __builtin_cpu_supports("avx512bf16");
}
#endif

// The products in use: the best usable set under the TQ_CPU cap, or none.
const GemmSet* active() {
  static const GemmSet* set = [] {
    if (std::strcmp(requested(), "generic") == 0) return static_cast<const GemmSet*>(nullptr);
    if (std::strcmp(requested(), "avx2") != 0 && gemm_set(Isa::avx512))
      return gemm_set(Isa::avx512);
    return gemm_set(Isa::avx2);
  }();
  return set;
}

// oneDNN's sgemm (dnnl_sgemm of oneDNN 2 and 3), loaded at run time: the binary links no
// oneDNN, and runs where none is installed (the Debian 13 root of the torch 2.x checks, the GPU
// machine).
struct Library {
  Sgemm sgemm = nullptr;
  std::string name;  // for the device line
};
Library& library() {  // (swap_library_sgemm replaces its sgemm for tests)
  static Library lib = [] {
    Library l;
#ifdef TQ_NO_DNNL
    return l;
#endif
    const char* e = std::getenv("TQ_DNNL");
    // measured faster than our AVX-512 fp32 kernels only (docs/performance.md)
    if ((e && std::strcmp(e, "off") == 0) || !active() || std::strcmp(active()->name, "avx2") == 0)
      return l;
    for (const char* so : {"libdnnl.so.2", "libdnnl.so.3"}) {
      void* h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
      if (!h) continue;
      using Version = const int* (*)();  // dnnl_version_t*: major, minor, patch first
      const auto version = reinterpret_cast<Version>(dlsym(h, "dnnl_version"));
      if ((l.sgemm = reinterpret_cast<Sgemm>(dlsym(h, "dnnl_sgemm")))) {
        const int* v = version ? version() : nullptr;
        l.name = v ? "oneDNN " + std::to_string(v[0]) + "." + std::to_string(v[1]) : "oneDNN";
        break;
      }
      dlclose(h);
    }
    return l;
  }();
  return lib;
}

const long l1_bytes = sysconf(_SC_LEVEL1_DCACHE_SIZE), l1_ways = sysconf(_SC_LEVEL1_DCACHE_ASSOC);
std::atomic<bool> narrow_forced{false};

}  // namespace

// A block's row j >= q0 holds w - first(j, q0) elements, w = nq rounded up to 16: the rows
// q0..q0+u-1 hold u w - 16 sum_{i<u} floor(i / 16) of them.
static int64_t diagonal_rows(int64_t u, int64_t w) {
  const int64_t m = u / 16, r = u % 16;
  return u * w - 16 * (16 * m * (m - 1) / 2 + r * m);
}
AttnProbs::AttnProbs(int64_t T) : T_(T), base_(1, 0) {
  for (int64_t q0 = 0; q0 < T; q0 += kAttnQB) {
    const int64_t nq = T - q0 < kAttnQB ? T - q0 : kAttnQB, w = (nq + 15) / 16 * 16;
    base_.push_back(base_.back() + q0 * w + diagonal_rows(nq, w));
  }
}
int64_t AttnProbs::row(int64_t q0, int64_t j) const {
  const int64_t nq = T_ - q0 < kAttnQB ? T_ - q0 : kAttnQB, w = (nq + 15) / 16 * 16;
  return base_[std::size_t(q0 / kAttnQB)] + (j < q0 ? j * w : q0 * w + diagonal_rows(j - q0, w));
}
bool AttnProbs::saves(int64_t H, int64_t KVH, int64_t D) const {
  // (elements per token: P about H T / 2, q, k, v and out 2 (H + KVH) D)
  return H * per_head() <= T_ * 2 * (H + KVH) * D;
}
int64_t AttnProbs::stats_floats(int64_t B, int64_t T, int64_t H, int64_t KVH, int64_t D,
                                bool bf16) {
  const AttnProbs pr(T);
  if (!pr.saves(H, KVH, D)) return B * H * T;
  const int64_t n = B * H * pr.per_head();
  return B * H * T + 16 + (bf16 ? (n + 1) / 2 : n);
}
void* AttnProbs::probs(const float* stats, int64_t B, int64_t T, int64_t H) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(stats + B * H * T);
  return reinterpret_cast<void*>((p + 63) / 64 * 64);
}

bool narrow_fits_l1(int rows, int64_t panel_bytes, int64_t l1_bytes, int64_t l1_ways) {
  if (l1_bytes <= 0 || l1_ways <= 0) return false;  // (unknown: pack)
  const int64_t way = l1_bytes / l1_ways;           // a contiguous panel's bytes per line of a set
  return rows + (panel_bytes + way - 1) / way <= l1_ways;
}
bool narrow_a_in_place(int rows, int64_t panel_bytes) {
  return narrow_forced.load(std::memory_order_relaxed) ||
         narrow_fits_l1(rows, panel_bytes, l1_bytes, l1_ways);
}
void force_narrow_a_in_place(bool on) {
  narrow_forced.store(on, std::memory_order_relaxed);
}

const GemmSet* gemm_set(Isa isa) {
#ifdef TQ_NO_X86_KERNELS
  (void)isa;
  return nullptr;
#else
  static const GemmSet k512 = {
      "avx512",
      avx512::kernels.f32,
      avx2::kernels.bf16,
      avx512::kernels.gemv_f32,
      avx2::kernels.gemv_bf16,
      avx2::kernels.bf16_sgd,
      avx512::kernels.f32_dx_sgd,
      avx2::kernels.bf16_dx_sgd,
      {avx512::kernels.attn_fwd[0], avx2::kernels.attn_fwd[1], avx2::kernels.attn_fwd[2]},
      {avx512::kernels.attn_bwd[0], avx2::kernels.attn_bwd[1], avx2::kernels.attn_bwd[2]}};
  if (isa == Isa::avx512)
    return cpu_avx512bf16() ? &avx512::kernels : cpu_avx512() ? &k512 : nullptr;
  return cpu_avx2() ? &avx2::kernels : nullptr;
#endif
}

bool own_kernels() {
  return active() != nullptr;
}

bool library_dx() {
  return library().sgemm != nullptr;
}
Sgemm swap_library_sgemm(Sgemm fn) {
  const Sgemm old = library().sgemm;
  library().sgemm = fn;
  return old;
}

const char* kernels_name() {
  static const std::string name = [] {
    const GemmSet* s = active();
    if (!s) return std::string("OpenBLAS kernels");
    std::string n = std::strcmp(s->name, "avx512") == 0 ? "avx512 kernels, avx2 for bf16"
                    : std::strcmp(s->name, "avx2") == 0 ? "avx2 kernels"
                                                        : "avx512_bf16 kernels";
    if (library_dx()) n += ", " + library().name + " for fp32 dx";
    return n;
  }();
  return name.c_str();
}

bool gemv_fits(bool bf16_kind, int64_t M, int64_t N, int64_t K, const View& A, const View& B) {
  return M >= 1 && M <= kGemvRows && N >= 1 && K >= 1 && A.ks == 1 && B.ks == 1 &&
         B.bf16 == bf16_kind;
}

void gemm_f32(int64_t M, int64_t N, int64_t K, View A, View B, float* C, int64_t ldc,
              bool accumulate, float alpha, Store store) {
  if (!active() || store == Store::bf16) std::abort();  // callers check own_kernels()
  if (gemv_fits(false, M, N, K, A, B))
    return active()->gemv_f32(M, N, K, A, B, C, ldc, accumulate, alpha, store);
  active()->f32(M, N, K, A, B, C, ldc, accumulate, alpha, store);
}
void gemm_bf16(int64_t M, int64_t N, int64_t K, View A, View B, void* C, int64_t ldc,
               bool accumulate, float alpha, Store store) {
  if (!active() || (store == Store::bf16 && (accumulate || alpha != 1.0f))) std::abort();
  if (gemv_fits(true, M, N, K, A, B))
    return active()->gemv_bf16(M, N, K, A, B, static_cast<float*>(C), ldc, accumulate, alpha,
                               store);
  active()->bf16(M, N, K, A, B, static_cast<float*>(C), ldc, accumulate, alpha, store);
}
void gemm_bf16_sgd(int64_t M, int64_t N, int64_t K, View A, View B, uint16_t* W, int64_t ldw,
                   float lr) {
  if (!active()) std::abort();
  active()->bf16_sgd(M, N, K, A, B, W, ldw, lr);
}

void gemm_f32_dx_sgd(int64_t M, int64_t OC, int64_t IC, const float* dout, const float* x, float* W,
                     float* dx, float lr) {
  if (!active()) std::abort();
  if (M >= kLibraryDxRows && library_dx()) {
    const int status =
        library().sgemm('N', 'N', M, IC, OC, 1.0f, dout, OC, W, IC, 0.0f, dx, IC);  // dx = dout W
    if (status == 0) {  // then the SGD step, ours: W = fma(sum, -lr, W) over doutᵀ x
      active()->f32(OC, IC, M, View{dout, false, 1, OC}, View{x, false, 1, IC}, W, IC, true, -lr,
                    Store::f32);
      return;
    }
    static std::atomic<bool> told{false};
    if (!told.exchange(true))
      std::fprintf(stderr, "warning: %s sgemm failed (status %d); fp32 dx on our kernels\n",
                   library().name.empty() ? "the library's" : library().name.c_str(), status);
  }
  active()->f32_dx_sgd(M, OC, IC, dout, x, W, dx, lr);
}

void gemm_bf16_dx_sgd(int64_t M, int64_t OC, int64_t IC, View dout, View doutT, View x, uint16_t* W,
                      void* dx, Store st, float lr) {
  if (!active()) std::abort();
  active()->bf16_dx_sgd(M, OC, IC, dout, doutT, x, W, dx, st, lr);
}

void attention_forward_kernels(bool bf16, bool h16, float* out, float* lse, const float* q,
                               const float* k, const float* v, int64_t B, int64_t T, int64_t H,
                               int64_t KVH, int64_t D, const int32_t* doc, const QkNorm* qn) {
  if (!active() || (h16 && !bf16)) std::abort();  // (bf16 storage: the bf16 kind only)
  active()->attn_fwd[bf16 ? 1 + h16 : 0](out, lse, q, k, v, B, T, H, KVH, D, doc, qn);
}
void attention_backward_kernels(bool bf16, bool h16, float* dq, float* dk, float* dv,
                                const float* dout, const float* out, const float* lse,
                                const float* q, const float* k, const float* v, int64_t B,
                                int64_t T, int64_t H, int64_t KVH, int64_t D, const int32_t* doc,
                                const QkNorm* qn) {
  if (!active() || (h16 && !bf16)) std::abort();
  active()->attn_bwd[bf16 ? 1 + h16 : 0](dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KVH, D, doc,
                                         qn);
}

}  // namespace tq::cpu
