// The blocked product around a micro-kernel (contract in gemm.h), included by one file per
// instruction set (gemm_avx512.cpp, gemm_avx2.cpp), each compiled with its own flags. All of
// it is in an anonymous namespace, so every including file gets its own copy: an inline
// function shared between them (std::min, containers, core/common.h) could be merged by the
// linker into the copy built for the widest instructions and then run on CPUs without them.
//
// Blocking (BLIS order): each thread owns a band of C and, for each block of NC columns and
// KC k-slots, packs B[block, slots] and then A[MC rows, slots] into panels of NR columns /
// MR rows (one 32-bit slot = one fp32 k, or a bf16 pair of k's, stored panel[s][r]); every
// MR x NR tile of C is one micro-kernel call. Each tile is summed by one thread in slot
// order, so results do not depend on the thread count. With few rows (W1's 32 tokens) the
// weights stream from DRAM: B panels are packed as they are used while the next one is
// prefetched into L2 across the current sums, and C tiles are prefetched ahead.
//
// A kernel set is a struct with
//   MR, NR                 tile rows and columns
//   kBf16Slot              the bf16 kind's slot: Slot::bf16x2 (pair products) or Slot::bf16
//   pack<SL>(dst, v, rows, K, r0, R, s0, S)   dst[s * R + r] = slot s0 + s of row r0 + r,
//                                             zero outside the matrix
//   pack_panels<SL>(dst, v, rows, K, r0, n, R, s0, S)   the R-row panels of rows r0..r0+n,
//                                             dst [n / R][S][R] (as pack, panel by panel)
//   micro<SL, SGD16>(S, A, B, C, ldc, mr, nr, acc, alpha, init, ldi, pf, npf, st)
//                          C[mr, nr] (+)= Ap[S][MR] x Bp[S][NR] (below).
//   kInPlaceA              true if it also has, with A read in place (gemm_skinny, attention,
//                          the fp32 scaled sums of rows-contiguous A, narrow products below):
//     in_place(bf16_kind, A, K)   whether micro_inplace can read these rows
//     micro_inplace(S, A, bf16, lda, B, C, ldc, mr, nr, acc, pf, npf),
//     store_t(C, ldc, T, mr, nr, st),
//     micro_cols(S, A, lda, B, C, ldc, mr, nr, acc, st[, alpha, init, ldi, pf, npf])
//                          (each documented with its kernel set)
//   kScaledColsA           whether scaled sums (alpha, SGD) read a rows-contiguous fp32 A in
//                          place with micro_cols instead of packing it (needs kInPlaceA, and
//                          micro_cols with its optional arguments)
//   kInPlaceB              true if it also has, with B's rows read in place (fp32, or BF:
//                          bf16 rows, a slot two of them):
//     micro_bip<BF>(S, A, B, ldb, C, ldc, mr, nr, acc, pf, npf, st)
// and for the GEMV path (gemv below):
//   gemv_r(M)              W rows summed at once against M rows of A (at most kGemvMaxR)
//   gemv_a<BF>(A, M, K, lda)   A as gemv_rows reads it: in place, or converted into the
//                          calling thread's workspace (row stride lda of its elements)
//   gemv_rows<BF>(M, K, a, lda, w, sums, lds)   sums[(m * gemv_r(M) + r) * lds] = row m of a .
//                          row w[r] of W (K elements of the kind's storage, contiguous), each
//                          in one accumulator whose lanes are added in a fixed tree at the end
#pragma once
#include <omp.h>
#include <xmmintrin.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cpu/gemm.h"

namespace tq::cpu {
namespace {

// What one 32-bit slot of a packed panel holds.
enum class Slot {
  f32,     // one k, fp32
  bf16,    // one k rounded to bf16, as fp32 bits
  bf16x2,  // two k's rounded to bf16: low half the even k
};
constexpr int64_t per_slot(Slot s) {
  return s == Slot::bf16x2 ? 2 : 1;
}

constexpr int64_t KCMAX = 256;   // slots per k block: B panel <= 32 KiB (L1)
constexpr int64_t NC = 3072;     // columns per block: packed B <= 3 MiB (L3)
constexpr int64_t MC = 144;      // rows per block: packed A <= 144 KiB (L2)
constexpr int64_t SCMAX = 2048;  // slots of a scaled sum done as one k block

inline int64_t lo(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Grow-only workspace of the calling thread (attention calls products from its workers),
// freed when the thread ends (OpenMP retires pool threads when the thread count drops).
// Slot 1 is a second one, for results kept across the products a thread calls. Sized by the
// first step's shapes; where memory runs out the process says so and exits 2 (no exception
// can leave an OpenMP region, and no file is open for writing while the kernels run).
uint32_t* workspace(int64_t words, int slot = 0) {
  struct Buffer {
    uint32_t* p = nullptr;
    int64_t cap = 0;
    ~Buffer() { std::free(p); }
  };
  static thread_local Buffer bufs[2];
  Buffer& buf = bufs[slot];
  if (words > buf.cap) {
    std::free(buf.p);
    buf.cap = words + words / 4;
    const size_t bytes = size_t((buf.cap * 4 + 63) / 64 * 64);
    buf.p = static_cast<uint32_t*>(std::aligned_alloc(64, bytes));
    if (!buf.p) {
      std::fprintf(stderr,
                   "error: out of memory: the CPU kernels' packing buffer (%.1f MiB) could not be "
                   "allocated; free memory, or lower --batch-size, --seq-len or --threads\n",
                   double(bytes) / (1 << 20));
      std::_Exit(2);
    }
  }
  return buf.p;
}

inline uint16_t to_bf16(float f) {  // round to nearest even (NaN stays NaN)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
// x rounded to the nearest bf16 as fp32 (the same bits as to_bf16; branch-free, so `omp simd`
// loops that call it vectorize)
inline float round_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u & 0x7fffffffu) > 0x7f800000u ? u | 0x400000u : u + 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}
inline uint16_t elem_bf16(const View& v, int64_t i, int64_t k) {
  const int64_t off = i * v.rs + k * v.ks;
  return v.bf16 ? static_cast<const uint16_t*>(v.p)[off]
                : to_bf16(static_cast<const float*>(v.p)[off]);
}
inline uint32_t elem_f32(const View& v, int64_t i, int64_t k) {
  const int64_t off = i * v.rs + k * v.ks;
  if (v.bf16) return uint32_t(static_cast<const uint16_t*>(v.p)[off]) << 16;
  uint32_t u;
  std::memcpy(&u, static_cast<const float*>(v.p) + off, 4);
  return u;
}

// Any layout, one element at a time: the general strided views and the kernels' edges.
template <Slot SL>
void pack_scalar(uint32_t* dst, const View& v, int64_t rows, int64_t K, int64_t r0, int R,
                 int64_t s0, int64_t S) {
  for (int64_t s = 0; s < S; ++s)
    for (int r = 0; r < R; ++r) {
      const int64_t i = r0 + r;
      uint32_t w = 0;
      if (i < rows) {
        if (SL == Slot::bf16x2) {
          const int64_t k = 2 * (s0 + s);
          if (k < K) w = elem_bf16(v, i, k);
          if (k + 1 < K) w |= uint32_t(elem_bf16(v, i, k + 1)) << 16;
        } else if (s0 + s < K) {
          w = SL == Slot::bf16 ? uint32_t(elem_bf16(v, i, s0 + s)) << 16 : elem_f32(v, i, s0 + s);
        }
      }
      dst[s * R + r] = w;
    }
}

// The lines of `runs` runs of `bytes` bytes each, `stride` bytes apart from p (at most cap of
// them, in that order). Counted first and filled by a plain loop: with the bound checked per
// line, building a W1 forward tile's list took ~9 % of the skinny product.
inline int run_lines(const char** out, int cap, const char* p, int64_t runs, int64_t stride,
                     int64_t bytes) {
  const int64_t per = (bytes + 63) / 64;
  if (runs <= 0 || per <= 0) return 0;
  const int64_t n = lo(cap, runs * per), whole = n / per;
  if (per == 2) {  // (a 32-column fp32 panel's k rows: vectorized across runs)
    for (int64_t r = 0; r < whole; ++r)
      out[2 * r] = p + r * stride, out[2 * r + 1] = p + r * stride + 64;
  } else {
    for (int64_t r = 0; r < whole; ++r)
      for (int64_t l = 0; l < per; ++l) out[r * per + l] = p + r * stride + l * 64;
  }
  for (int64_t l = 0; l < n - whole * per; ++l) out[whole * per + l] = p + whole * stride + l * 64;
  return int(n);
}

// The source lines pack() will read for these rows and slots, into `out` (at most `cap`):
// with few rows (W1's 32 tokens) each weight panel is used briefly, and DRAM latency, not
// bandwidth, bounds the product unless the next panel streams into L2 during this one --
// spread over its sum, since a burst of prefetches overflows the miss queues and is dropped.
template <Slot SL>
int panel_lines(const char** out, int cap, const View& v, int64_t rows, int64_t K, int64_t r0,
                int R, int64_t s0, int64_t S) {
  const int64_t per = per_slot(SL), es = v.bf16 ? 2 : 4, k0 = s0 * per, k1 = lo(K, (s0 + S) * per);
  const char* p = static_cast<const char*>(v.p);
  if (v.ks == 1)
    return run_lines(out, cap, p + (r0 * v.rs + k0) * es, lo(rows, r0 + R) - r0, v.rs * es,
                     (k1 - k0) * es);
  if (v.rs == 1 && r0 < rows)
    return run_lines(out, cap, p + (k0 * v.ks + r0) * es, k1 - k0, v.ks * es,
                     (lo(rows, r0 + R) - r0) * es);
  return 0;
}

// Tile address: C holds fp32, or (c16) bf16: weights for the fused SGD step, Store::bf16.
inline float* tile(float* C, int64_t off, bool c16) {
  return c16 ? reinterpret_cast<float*>(reinterpret_cast<uint16_t*>(C) + off) : C + off;
}

// C[mr, nr] (bf16) <- T (fp32, row stride ldt) rounded
inline void store_rounded(uint16_t* C, int64_t ldc, const float* T, int64_t ldt, int mr, int nr) {
  for (int r = 0; r < mr; ++r)
#pragma omp simd
    for (int j = 0; j < nr; ++j) {
      const float x = round_to_bf16(T[r * ldt + j]);
      uint32_t u;
      std::memcpy(&u, &x, 4);
      C[r * ldc + j] = uint16_t(u >> 16);
    }
}

// Slots per k block: at most KCMAX, blocks of equal size (a 256-wide K is one block).
int64_t kc_for(int64_t S) {
  const int64_t nb = (S + KCMAX - 1) / KCMAX;
  return ((S + nb - 1) / nb + 7) / 8 * 8;
}
// How many blocks of kc_for(S) slots S slots make.
int64_t k_blocks(int64_t S) {
  const int64_t kc = kc_for(S);
  return (S + kc - 1) / kc;
}

// C[M, N] = A Bᵀ with few rows in A (W1's 32 tokens) and B's rows contiguous in k (the
// weights of out = x Wᵀ, fp32 or bf16): the roles swap, Cᵀ = B Aᵀ, so that the kernel
// broadcasts the weights straight from memory, MR rows at a time (no transposing pack of B,
// no rounding of 32 rows up to tiles of MR), and only the small A is packed (the bf16 kind
// rounds it; B must then hold bf16 already, and in pairs an even K: Kern::in_place). Each tile sums
// its k blocks in a small buffer exactly as gemm() sums them into C: the same bits as gemm(). (dx =
// dout W the same way, broadcasting across W's rows, measured 30 % slower than packing.)
template <class Kern, bool BF>
void gemm_skinny(int64_t M, int64_t N, int64_t K, View A, View B, float* C, int64_t ldc, Store st) {
  constexpr int MR = Kern::MR, NR = Kern::NR;
  constexpr Slot SL = BF ? Kern::kBf16Slot : Slot::f32;
  constexpr int64_t per = per_slot(SL);  // K is a multiple of it (Kern::in_place)
  const int64_t S = K / per, KCB = kc_for(S), np = (M + NR - 1) / NR, es = B.bf16 ? 2 : 4;
  uint32_t* Ap = workspace(np * NR * S);  // per k block pc: panels jr at Ap + pc*np*NR + jr*kc
  const int64_t nb = k_blocks(S);
  const auto pack_a = [&](int64_t b0, int64_t b1) {  // k blocks [b0, b1)
    for (int64_t pc = b0 * KCB; pc < lo(S, b1 * KCB); pc += KCB)
      for (int64_t jr = 0; jr < M; jr += NR)
        Kern::template pack<SL>(Ap + pc * np * NR + jr * lo(KCB, S - pc), A, M, K, jr, NR, pc,
                                lo(KCB, S - pc));
  };
  const char* W = static_cast<const char*>(B.p);
  const auto band = [&](int t, int nt) {
    const int64_t mp = (N + MR - 1) / MR, n0 = lo(N, mp * t / nt * MR),
                  n1 = lo(N, mp * (t + 1) / nt * MR);
    alignas(64) float acc[MR * NR];
    constexpr int kLines = 512;
    const char* lines[kLines];
    for (int64_t i = n0; i < n1; i += MR) {
      const int mr = int(lo(MR, n1 - i));
      for (int64_t jr = 0; jr < M; jr += NR) {
        const int nr = int(lo(NR, M - jr));
        for (int64_t pc = 0; pc < S; pc += KCB) {
          const int64_t kc = lo(KCB, S - pc);
          // The first pass over these rows reads them from DRAM: fetch the next tile's
          // (the same k block) into L2 on the way, a line per slot.
          const int npf = jr == 0 && i + MR < n1
                              ? run_lines(lines, kLines, W + ((i + MR) * B.rs + pc * per) * es,
                                          lo(n1, i + 2 * MR) - (i + MR), B.rs * es, kc * per * es)
                              : 0;
          Kern::micro_inplace(kc, W + (i * B.rs + pc * per) * es, B.bf16, B.rs,
                              Ap + pc * np * NR + jr * kc, acc, NR, mr, nr, pc > 0, lines,
                              int(lo(npf, kc)));
        }
        Kern::store_t(tile(C, jr * ldc + i, st == Store::bf16), ldc, acc, mr, nr, st);
      }
    }
  };
  // A wide x (wo, w2: 256-384 KiB at W1) is packed by the threads, a share of its k blocks each
  // (W1 fp32 forward of w2 -17 %, wo -7 %)
  const bool serial = omp_in_parallel() || omp_get_max_threads() == 1;
  const int nthreads = serial ? 1 : omp_get_max_threads();
  const bool shared_pack = nb >= nthreads && !serial;
  if (!shared_pack) pack_a(0, nb);
  if (serial) return band(0, 1);
#pragma omp parallel num_threads(nthreads)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    if (shared_pack) {
      pack_a(nb * t / n, nb * (t + 1) / n);
#pragma omp barrier
    }
    band(t, n);
  }
}

// ---- GEMV (gemm.h): C[M, N] (+)= alpha A Bᵀ for M <= kGemvRows, B's rows contiguous ----

constexpr int kGemvMaxR = 8;  // most W rows a gemv_rows call sums at once
// Below this many bytes of W the product runs on the calling thread: a parallel region's start
// and end barrier (3-4 us on the Zen 5 VM) cost as much as the second thread saved up to 256 KiB
// (bf16 W, K = 1024: 9 against 9.5 us for one row), and 512 KiB took 7-13 % less on two.
constexpr int64_t kGemvSerialBytes = int64_t(512) << 10;
// Sums kept per row of A and sub-band before they are stored (below)
constexpr int kGemvRun = 16;
// fn(std::integral_constant<int, M>{}) for M in 1..kGemvRows: the kernels' row count as a
// template argument, chosen at run time (each instruction set's Kern::gemv_rows)
template <class Fn>
inline void with_gemv_rows(int M, Fn&& fn) {
  switch (M) {
    case 1:
      return fn(std::integral_constant<int, 1>());
    case 2:
      return fn(std::integral_constant<int, 2>());
    case 3:
      return fn(std::integral_constant<int, 3>());
    case 4:
      return fn(std::integral_constant<int, 4>());
    case 5:
      return fn(std::integral_constant<int, 5>());
    case 6:
      return fn(std::integral_constant<int, 6>());
    case 7:
      return fn(std::integral_constant<int, 7>());
    default:
      return fn(std::integral_constant<int, 8>());
  }
}

// C[m, c0..c0+n) from their sums s[0..n), as the packed kernels store them (gemm.h):
// fma(s, alpha, C) with accumulate and alpha, C + s, s * alpha; rounded for Store::round and
// Store::bf16 (C then uint16_t, neither accumulate nor alpha).
inline void gemv_store(float* C, int64_t off, const float* s, int n, bool acc, float alpha,
                       Store st) {
  if (st == Store::bf16) {
    store_rounded(reinterpret_cast<uint16_t*>(C) + off, 0, s, 0, 1, n);
    return;
  }
  float* c = C + off;
  if (acc && alpha != 1.0f) {
#pragma omp simd
    for (int j = 0; j < n; ++j) c[j] = __builtin_fmaf(s[j], alpha, c[j]);
  } else if (acc) {
#pragma omp simd
    for (int j = 0; j < n; ++j) c[j] = s[j] + c[j];
  } else if (alpha != 1.0f) {
#pragma omp simd
    for (int j = 0; j < n; ++j) c[j] = s[j] * alpha;
  } else {
    std::memcpy(c, s, size_t(n) * 4);
  }
  if (st == Store::round) {
#pragma omp simd
    for (int j = 0; j < n; ++j) c[j] = round_to_bf16(c[j]);
  }
}

// Each thread takes one contiguous band of W's rows (a static schedule; C's columns in
// multiples of 32, so that no line of C is written by two threads), and splits it into
// gemv_r(M) sub-bands of G rows: gemv_rows sums row i of every sub-band at once, so that each
// of its gemv_r streams of W runs through its sub-band from start to end, as the hardware
// prefetchers follow best (W1|W3 on 2 threads: one row 10-20 % and 8 rows ~10 % faster than
// with gemv_r consecutive rows, whose streams end every call; W2 the same either way). A
// sub-band past the band's end repeats sub-band 0's row (in L1 by then), its sums dropped. The
// sums of kGemvRun calls are stored together, each row of A and sub-band a run of contiguous
// columns: element by element after every call, the stores took 17-25 % of an 8-row product
// from L2. Nothing is shared between the threads but the end barrier; each converts A itself
// where the kernel needs it converted (M K elements).
template <class Kern, bool BF>
void gemv(int64_t M, int64_t N, int64_t K, View A, View B, float* C, int64_t ldc, bool accumulate,
          float alpha, Store st) {
  if (!gemv_fits(BF, M, N, K, A, B)) std::abort();  // (gemm.cpp checks first)
  const int R = Kern::gemv_r(int(M));
  const char* W = static_cast<const char*>(B.p);
  const int64_t ldw = B.rs * (BF ? 2 : 4);  // bytes
  const auto band = [&](int64_t n0, int64_t n1) {
    int64_t lda;
    const void* a = Kern::template gemv_a<BF>(A, int(M), K, lda);
    const int64_t G = (n1 - n0 + R - 1) / R;
    alignas(64) float sums[kGemvRows * kGemvMaxR * kGemvRun];  // [m][r][call]
    const void* w[kGemvMaxR];
    for (int64_t i0 = 0; i0 < G; i0 += kGemvRun) {
      const int calls = int(lo(kGemvRun, G - i0));
      for (int j = 0; j < calls; ++j) {
        for (int r = 0; r < R; ++r) {
          const int64_t n = n0 + r * G + i0 + j;
          w[r] = W + (n < n1 ? n : n0 + i0 + j) * ldw;
        }
        Kern::template gemv_rows<BF>(int(M), K, a, lda, w, sums + j, kGemvRun);
      }
      for (int r = 0; r < R; ++r) {
        const int64_t c0 = n0 + r * G + i0, n = lo(calls, n1 - c0);
        if (n <= 0) break;
        for (int64_t m = 0; m < M; ++m)
          gemv_store(C, m * ldc + c0, sums + (m * R + r) * kGemvRun, int(n), accumulate, alpha, st);
      }
    }
  };
  if (omp_in_parallel() || omp_get_max_threads() == 1 || N * ldw < kGemvSerialBytes)
    return band(0, N);
  constexpr int64_t kCols = 32;
  const int64_t units = (N + kCols - 1) / kCols;
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t n0 = lo(N, units * t / nt * kCols), n1 = lo(N, units * (t + 1) / nt * kCols);
    if (n1 > n0) band(n0, n1);
  }
}

// A band's last block as a queue of row panels [next, end): its owner takes blocks from the
// front, other threads halves of what is left from the back, both by one compare-and-swap.
// Before open() the owner is still on earlier blocks (others wait for it); after close()
// nothing is left to take.
struct alignas(64) StealQueue {
  std::atomic<uint64_t> range{0};             // end << 32 | next, in panels of the owner's band
  std::atomic<int> state{0};                  // 0 not yet open, 1 open, 2 closed
  void open(int64_t first, int64_t panels) {  // panels [first, panels) left
    range.store(uint64_t(panels) << 32 | uint64_t(first), std::memory_order_relaxed);
    state.store(1, std::memory_order_release);
  }
  void close() { state.store(2, std::memory_order_release); }
  bool waiting() const { return state.load(std::memory_order_acquire) == 0; }
  bool take_front(int64_t most, int64_t& p0, int64_t& n) {
    uint64_t r = range.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t next = int64_t(r & 0xffffffffu), end = int64_t(r >> 32);
      if (next >= end) return false;
      n = lo(most, end - next), p0 = next;
      if (range.compare_exchange_weak(r, uint64_t(end) << 32 | uint64_t(next + n),
                                      std::memory_order_relaxed))
        return true;
    }
  }
  bool take_back(int64_t most, int64_t& p0, int64_t& n) {
    if (state.load(std::memory_order_acquire) != 1) return false;  // owner's B not packed yet
    uint64_t r = range.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t next = int64_t(r & 0xffffffffu), end = int64_t(r >> 32);
      if (next >= end) return false;
      n = lo(most, (end - next + 1) / 2), p0 = end - n;
      if (range.compare_exchange_weak(r, uint64_t(p0) << 32 | uint64_t(next),
                                      std::memory_order_relaxed))
        return true;
    }
  }
};

// micro<SL, SGD16>(S, A, B, C, ldc, mr, nr, acc, alpha, init, ldi, pf, npf): the sum over S
// slots starts from zero, or from `init` (fp32 partial sums, row stride ldi) when given; it
// is stored as C = sum (alpha != 1: sum * alpha), with acc C += sum (alpha != 1:
// fma(sum, alpha, C)); with SGD16, C is a bf16 weight that takes the SGD step of gemm.h with
// alpha = bf16(-lr). pf[0..npf) are lines to prefetch into L2, one per slot. st: how the
// value is stored (gemm.h; rounded or bf16 on the last store of a tile only; f32 with SGD16).
template <class Kern, bool BF, bool SGD16 = false>
void gemm(int64_t M, int64_t N, int64_t K, View A, View B, float* C, int64_t ldc, bool accumulate,
          float alpha, Store st) {
  constexpr Slot SL = BF ? Kern::kBf16Slot : Slot::f32;
  constexpr int MR = Kern::MR, NR = Kern::NR;
  if (M <= 0 || N <= 0) return;
  if constexpr (Kern::kInPlaceA && !SGD16)
    if (M <= 4 * NR && !accumulate && alpha == 1.0f && B.ks == 1 && K > 0 &&
        Kern::in_place(BF, B, K))
      return gemm_skinny<Kern, BF>(M, N, K, A, B, C, ldc, st);
  const bool c16 = SGD16 || st == Store::bf16;              // C's elements are bf16
  const int64_t S = (K + per_slot(SL) - 1) / per_slot(SL);  // slots
  if (S == 0) {                                             // empty sum
    if (!accumulate)
      for (int64_t m = 0; m < M; ++m)
        std::memset(tile(C, m * ldc, c16), 0, size_t(N) * (c16 ? 2 : 4));
    else if (st == Store::round)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) C[m * ldc + n] = round_to_bf16(C[m * ldc + n]);
    return;
  }
  // Called from inside a parallel loop (attention's blocks): this thread does it all, without
  // the cost of entering a nested region.
  const bool serial = omp_in_parallel() || omp_get_max_threads() == 1;
  const int nthreads = serial ? 1 : omp_get_max_threads();
  // Few rows (dx = dout W at W1's 32 tokens) over many k blocks: the threads split the k
  // blocks, that is W's rows, not C's columns. Thread 0 sums its blocks in order (into C, or
  // for bf16 storage into a buffer), the others each block apart, and the blocks are then added
  // in k order and the sum stored as st says: the adds and the rounding one thread makes, so
  // the same bits. Each thread then reads the rows of W that it updates in the SGD product that
  // follows (split by rows). Split by columns, half of the lines of W that a thread updated had
  // been read by the other core, and a store to a line the other core holds waits on it: on
  // the Zen 5 VM a pass updating 6 MiB in place ran at ~300 GB/s, or ~27 GB/s after the other
  // core had read it, and the W1 fp32 SGD products of qkv and w13 at half speed.
  if (!serial && M <= MC && !accumulate && alpha == 1.0f && !SGD16) {
    const int64_t KB = kc_for(S), nb = k_blocks(S);
    if (nb >= 2 * nthreads) {
      const int64_t per = per_slot(SL), kb = KB * per, ea = A.bf16 ? 2 : 4, eb = B.bf16 ? 2 : 4;
      const auto blk = [&](int64_t b) {  // block b's k range as views, and its length
        const int64_t k0 = b * kb;
        return std::make_tuple(
            View{static_cast<const char*>(A.p) + k0 * A.ks * ea, A.bf16, A.rs, A.ks},
            View{static_cast<const char*>(B.p) + k0 * B.ks * eb, B.bf16, B.rs, B.ks},
            lo(kb, K - k0));
      };
      std::vector<float*> parts(size_t(nthreads), nullptr);
#pragma omp parallel num_threads(nthreads)
      {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        const int64_t b0 = nb * t / n, b1 = nb * (t + 1) / n;
        // thread 0: its running sum (in C unless C is bf16); others: their blocks
        const int64_t words = t > 0 ? (b1 - b0) * M * N : c16 ? M * N : 0;
        float* P = words ? reinterpret_cast<float*>(workspace(words, 1)) : nullptr;
        parts[size_t(t)] = P;
        for (int64_t b = b0; b < b1; ++b) {
          const auto [Ab, Bb, Kb] = blk(b);
          if (t == 0)
            gemm<Kern, BF>(M, N, Kb, Ab, Bb, c16 ? P : C, c16 ? N : ldc, b > 0, 1.0f, Store::f32);
          else
            gemm<Kern, BF>(M, N, Kb, Ab, Bb, P + (b - b0) * M * N, N, false, 1.0f, Store::f32);
        }
#pragma omp barrier
        for (int64_t m = M * t / n; m < M * (t + 1) / n; ++m) {  // rows of C, blocks in k order
          float* c = c16 ? parts[0] + m * N : C + m * ldc;
          for (int u = 1; u < n; ++u)
            for (int64_t b = nb * u / n; b < nb * (u + 1) / n; ++b) {
              const float* p = parts[size_t(u)] + ((b - nb * u / n) * M + m) * N;
#pragma omp simd
              for (int64_t j = 0; j < N; ++j) c[j] = p[j] + c[j];
            }
          if (st == Store::round)
            for (int64_t j = 0; j < N; ++j) c[j] = round_to_bf16(c[j]);
          else if (c16)
            store_rounded(reinterpret_cast<uint16_t*>(C) + m * ldc, ldc, c, N, 1, int(N));
        }
      }
      return;
    }
  }
  // With alpha or the SGD step, the sum must be whole before the store: when it spans k
  // blocks, each C block is finished over all of them (partial sums in a per-thread fp32
  // block) before the next, at the price of packing B again for every block of rows.
  // A scaled sum up to SCMAX slots (the fused SGD over 2048 tokens) is one k block: measured
  // faster than finishing C blocks over several; NC shrinks to keep packed B within 4 MiB.
  const bool scaled = alpha != 1.0f || SGD16;
  const bool narrow_ok = Kern::kInPlaceA && narrow_a_in_place(MR, NR * KCMAX * 4);  // (below)
  // bf16 storage cannot hold partial sums either: a sum over several k blocks is packed as one
  // block like a scaled sum, summed in Tp by sub-blocks that are the fp32 path's k blocks (in
  // its order), and rounded into C when whole: the bits of Store::round. Over SCMAX slots each
  // C block is finished over the fp32 path's k blocks, the same sums in Tp.
  const bool whole = scaled || st == Store::bf16;
  const int64_t KCB = whole && S <= SCMAX ? S : kc_for(S);
  const int64_t panels = (int64_t(1) << 20) / KCB / NR,
                NCB = lo(NC, (panels > 0 ? panels : 1) * NR);
  const bool finish = whole && S > KCB;
  // A long scaled sum packed as one block is still summed by sub-blocks of KCMAX slots (the
  // partial sums in Tp, as for finish), so that B sub-panels stay in L1 across their tiles.
  const bool split = whole && !finish && S > KCMAX;
  // B's rows contiguous (dx = dout W) that, with one block of rows (W1), the kernel can read
  // where they lie: fp32 rows, or for the bf16 kind bf16 rows of an even K, each tile's sum
  // stored whole (bip16), the kernel pairing two k rows a slot (below).
  const bool bip16 = SL != Slot::f32 && B.bf16 && K % 2 == 0 && !split && !finish;
  const bool bip_rows =
      Kern::kInPlaceB && B.rs == 1 && !scaled && (SL == Slot::f32 ? !B.bf16 : bip16);
  const int64_t per_thread = (MC + NCB) * KCB + (finish || split ? MC * NCB : 0);
  uint32_t* ws = workspace(per_thread * nthreads);
  // Each thread owns a band of C (columns, or rows when there are more rows) and runs the
  // blocked product on it with its own packing buffers: no barriers, and B or A is packed
  // straight from memory into the cache that uses it.
  const auto band_of = [&](int t, int nt, int64_t& m0, int64_t& m1, int64_t& n0, int64_t& n1) {
    m0 = 0, m1 = M, n0 = 0, n1 = N;
    if (N / NR >= M / MR) {
      const int64_t np = (N + NR - 1) / NR;
      n0 = lo(N, np * t / nt * NR), n1 = lo(N, np * (t + 1) / nt * NR);
    } else {
      const int64_t mp = (M + MR - 1) / MR;
      m0 = lo(M, mp * t / nt * MR), m1 = lo(M, mp * (t + 1) / nt * MR);
    }
  };
  const auto last_jc = [&](int64_t n0, int64_t n1) { return n0 + (n1 - n0 - 1) / NCB * NCB; };
  // The last block of each band (its last columns and k slots) is a queue of MR-row panels
  // that other threads take from the back once their own bands are done: equal bands still
  // finish apart (interrupts, a busy host), by ~5 % of a product's time at W2 on this VM.
  // Each tile is still summed whole by one thread from the owner's packed B, in the same
  // order: the same bits for any thread count.
  std::vector<StealQueue> queues(size_t(serial ? 0 : nthreads));
  const auto band = [&](int t, int nt) {
    int64_t m0, m1, n0, n1;
    band_of(t, nt, m0, m1, n0, n1);
    uint32_t* Bp = ws + per_thread * t;
    uint32_t* Ap = Bp + NCB * KCB;
    float* Tp = reinterpret_cast<float*>(Ap + MC * KCB);  // [MC, NCB] partial sums (finish)
    constexpr int kLines = 2048;
    const char* lines[kLines];
    // Rows ic..ic+mc of the block of columns jc..jc+nc and slots pc..pc+kc, B's panels packed
    // in Bb (by this thread or, for rows taken from another's queue, by their owner) unless
    // stream, or packb (split sums: packed into Bp here, as the tiles first need them). Every
    // tile of the rows is summed and stored.
    const auto rows = [&](int64_t ic, int64_t mc, const uint32_t* Bb, int64_t jc, int64_t nc,
                          int64_t pc, int64_t kc, bool stream, bool packb) {
      const bool last = pc + kc == S;
      const int64_t mt = (mc + MR - 1) / MR * MR;
      // Short sums over many rows (the SGD step over 32 tokens): the traffic is C, read
      // and written once; tiles along its rows keep that to MR streams from DRAM.
      const bool by_rows = !stream && kc <= 64;
      // One block of rows (dx = dout W at 32 tokens) and B's fp32 rows contiguous (or bf16
      // ones: bip16): the kernel reads B's panels where they lie, no copy (the kernel set
      // permitting).
      const bool bip = stream && bip_rows;
      // A by sub-blocks of `sub` slots, each contiguous: [s0][ir][slot][MR] (one sub-block
      // of kc slots unless split).
      const int64_t sub = !split ? kc : scaled ? KCMAX : kc_for(kc);
      // The scaled sums' fp32 A with its rows contiguous (doutᵀ of the SGD product): read in
      // place, MR rows of a slot side by side, instead of copied from DRAM before its tiles
      // (the copy waited on its loads: 15 % of the product's time on this VM).
      const bool acols =
          Kern::kScaledColsA && SL == Slot::f32 && split && !stream && A.rs == 1 && !A.bf16;
      // A block that serves few columns (at most 256: long sums into 256 columns, the forward
      // of wo, w2 and dx of qkv, w13 at W2) is read in place, MR rows a slot, not packed: its
      // pack (a transpose of rows 8-24 KiB apart, from DRAM) served 16 AVX2 panels only. Where
      // the L1d holds the tile's rows beside the B panel (narrow_ok): on the Zen 5 VM the AVX2
      // set, fp32 products -9.5 to -12.5 % over 3 minutes of calls. Its AVX-512 set (12 rows
      // and a 32 KiB panel: 20 lines for a 12-way set) measured -6 to +5 % by turns, and +7 to
      // +20 % in slow phases: it packs. With more columns packing is as fast or faster, and so
      // it is with one block of rows (W1, stream). The same sums in the same order: the same
      // bits.
      const bool narrow = narrow_ok && A.ks == 1 && !scaled && !finish && !stream && nc <= 256;
      const bool ainp = narrow && SL == Slot::f32 && !A.bf16 && !split && st == Store::f32;
      const bool ainp16 = narrow && SL != Slot::f32 && A.bf16 && Kern::in_place(true, A, K) &&
                          split && st == Store::bf16;
      const auto a_at = [&](int64_t ir, int64_t s) -> const void* {  // row ic + ir from slot s
        const int64_t e = (ic + ir) * A.rs + per_slot(SL) * s;
        if (A.bf16) return static_cast<const uint16_t*>(A.p) + e;
        return static_cast<const float*>(A.p) + e;
      };
      for (int64_t s0 = 0; s0 < kc && !acols && !ainp && !ainp16; s0 += sub)
        Kern::template pack_panels<SL>(Ap + s0 * mt, A, M, K, ic, mc, MR, pc + s0,
                                       lo(sub, kc - s0));
      // Sub-block s0 of one tile; pf[0..np) are lines of the next B panel to fetch on the
      // way. Partial sums go to Tp until the tile's last slot (finish, split); the last
      // store starts from them.
      const auto run_tile = [&](int64_t ir, int64_t jr, int64_t s0, const char* const* pf, int np) {
        const int64_t sn = lo(sub, kc - s0);
        const int mr = int(lo(MR, mc - ir)), nr = int(lo(NR, nc - jr));
        const uint32_t *a = Ap + s0 * mt + ir * sn, *b = Bb + jr * kc + s0 * NR;
        float* c = tile(C, (ic + ir) * ldc + jc + jr, c16);
        const Store sl = last ? st : Store::f32;  // how the last store of the tile is made
        float* tp = Tp + ir * NCB + jr;
        const bool earlier = (finish && pc > 0) || s0 > 0;  // partial sums in Tp
        if constexpr (Kern::kScaledColsA)
          if (acols && mr == MR) {
            const float* ap = static_cast<const float*>(A.p) + (pc + s0) * A.ks + ic + ir;
            if ((finish && !last) || s0 + sn < kc)
              Kern::micro_cols(sn, ap, A.ks, b, tp, NCB, mr, nr, earlier, Store::f32, 1.0f, nullptr,
                               0, pf, np);
            else if (earlier)
              Kern::micro_cols(sn, ap, A.ks, b, c, ldc, mr, nr, accumulate, st, alpha, tp, NCB, pf,
                               np);
            else
              Kern::micro_cols(sn, ap, A.ks, b, c, ldc, mr, nr, accumulate || pc > 0, sl,
                               last ? alpha : 1.0f, nullptr, 0, pf, np);
            return;
          }
        if (acols) {  // the last rows: packed here (in place, their slots would run past A)
          a = Ap;
          Kern::template pack<SL>(Ap, A, M, K, ic + ir, MR, pc + s0, sn);
        }
        if (ainp)  // (one sub-block: s0 = 0)
          return Kern::micro_inplace(sn, a_at(ir, pc), false, A.rs, b, c, ldc, mr, nr,
                                     accumulate || pc > 0, pf, np);
        if constexpr (Kern::kInPlaceB)
          if (bip)  // (one k block per tile store: not scaled)
            return Kern::template micro_bip<SL != Slot::f32>(
                sn, a,
                static_cast<const char*>(B.p) +
                    (per_slot(SL) * pc * B.ks + jc + jr) * (B.bf16 ? 2 : 4),
                B.ks, c, ldc, mr, nr, accumulate || pc > 0, pf, np, sl);
        if ((split || finish) && st == Store::bf16) {  // sums in Tp, rounded into C when whole
          if (ainp16)
            Kern::micro_inplace(sn, a_at(ir, pc + s0), true, A.rs, b, tp, NCB, mr, nr, earlier, pf,
                                np);
          else
            Kern::template micro<SL, false>(sn, a, b, tp, NCB, mr, nr, earlier, 1.0f, nullptr, 0,
                                            pf, np);
          if (last && s0 + sn == kc)
            store_rounded(reinterpret_cast<uint16_t*>(c), ldc, tp, NCB, mr, nr);
        } else if ((finish && !last) || s0 + sn < kc)
          Kern::template micro<SL, false>(sn, a, b, tp, NCB, mr, nr, earlier, 1.0f, nullptr, 0, pf,
                                          np);
        else if (earlier)
          Kern::template micro<SL, SGD16>(sn, a, b, c, ldc, mr, nr, accumulate, alpha, tp, NCB, pf,
                                          np, st);
        else
          Kern::template micro<SL, SGD16>(sn, a, b, c, ldc, mr, nr, accumulate || pc > 0,
                                          last ? alpha : 1.0f, nullptr, 0, pf, np, sl);
      };
      const auto prefetch_c = [&](int64_t pi, int64_t pj) {
        for (int r = 0; r < int(lo(MR, mc - pi)); ++r) {
          const char* cr =
              reinterpret_cast<const char*>(tile(C, (ic + pi + r) * ldc + jc + pj, c16));
          _mm_prefetch(cr, _MM_HINT_T0);
          _mm_prefetch(cr + (c16 ? 2 : 4) * NR - 1, _MM_HINT_T0);
        }
      };
      if (split) {  // each tile summed by sub-blocks, in the same order either way
        // Sub-panel (jr, s0) over all rows; (jn, sn) the one after it (jn >= nc: none). When
        // packing here, each is packed just before its tiles, and the source lines of the next
        // are fetched into L2 across them: B (the SGD product's x, 16-24 MiB) is read from
        // DRAM during the sums, not in a pass of its own before them.
        const int64_t tiles = (mc + MR - 1) / MR;
        const auto sub_panel = [&](int64_t jr, int64_t s0, int64_t jn, int64_t sn) {
          int npf = 0;
          if (stream || packb) {
            Kern::template pack<SL>(Bp + jr * kc + s0 * NR, B, N, K, jc + jr, NR, pc + s0,
                                    lo(sub, kc - s0));
            if (jn < nc)
              npf = panel_lines<SL>(lines, kLines, B, N, K, jc + jn, NR, pc + sn, lo(sub, kc - sn));
          }
          // (a kernel fetches at most one line a slot)
          const int per_tile = int(lo((npf + tiles - 1) / tiles, lo(sub, kc - s0)));
          for (int64_t ir = 0; ir < mc; ir += MR) {
            const int t0 = int(ir / MR) * per_tile;
            run_tile(ir, jr, s0, lines + t0, int(lo(per_tile, npf - t0 > 0 ? npf - t0 : 0)));
          }
        };
        // A B sub-panel stays in L1 across the tiles of a column. With A packed (in L2), B
        // panels outer: the partial sums of one panel's tiles, not of the whole block, are
        // live (bf16 and AVX2 backward -1 % by the layer A/B); with A read in place, sub-blocks
        // outer, so that each of its strips comes from memory once (+1-2 % the other way).
        if (!acols)
          for (int64_t jr = 0; jr < nc; jr += NR)
            for (int64_t s0 = 0; s0 < kc; s0 += sub)
              s0 + sub < kc ? sub_panel(jr, s0, jr, s0 + sub) : sub_panel(jr, s0, jr + NR, 0);
        else
          for (int64_t s0 = 0; s0 < kc; s0 += sub)
            for (int64_t jr = 0; jr < nc; jr += NR)
              jr + NR < nc ? sub_panel(jr, s0, jr + NR, s0)
                           : sub_panel(jr, s0, s0 + sub < kc ? 0 : nc, s0 + sub);
        return;
      }
      if (by_rows) {  // C is the traffic: walk it along its rows (few DRAM streams)
        for (int64_t ir = 0; ir < mc; ir += MR)
          for (int64_t jr = 0; jr < nc; jr += NR) {
            int64_t pi = ir, pj = jr + 4 * NR;  // the tile four ahead
            if (pj >= nc) pj -= (nc + NR - 1) / NR * NR, pi += MR;
            if (pi < mc && pj < nc) prefetch_c(pi, pj);
            run_tile(ir, jr, 0, nullptr, 0);
          }
        return;
      }
      for (int64_t jr = 0; jr < nc; jr += NR) {
        int npf = 0;  // next panel's lines, handed out to this panel's tiles
        if (stream) {
          if (!bip) Kern::template pack<SL>(Bp + jr * kc, B, N, K, jc + jr, NR, pc, kc);
          if (jr + NR < nc)
            npf = panel_lines<SL>(lines, kLines, B, N, K, jc + jr + NR, NR, pc, kc);
          else if (!last)  // the next k block's first panel
            npf = panel_lines<SL>(lines, kLines, B, N, K, jc, NR, pc + kc, lo(KCB, S - pc - kc));
        }
        const int per_tile = int((npf + (mc + MR - 1) / MR - 1) / ((mc + MR - 1) / MR));
        for (int64_t ir = 0; ir < mc; ir += MR) {
          {  // C of the tile four ahead (short sums leave DRAM latency exposed)
            int64_t pi = ir + 4 * MR, pj = jr;
            if (pi >= mt) pi -= mt, pj += NR;
            if (pj < nc && pi < mc) prefetch_c(pi, pj);
          }
          const int t0 = int(ir / MR) * per_tile;
          run_tile(ir, jr, 0, lines + t0, int(lo(per_tile, lo(kc, npf - t0 > 0 ? npf - t0 : 0))));
        }
      }
    };
    // One block of rows: B packed panel by panel as its tiles need it, the next panel fetched
    // meanwhile. Not for bf16 slots from B's rows contiguous (dx = dout W of bf16 runs at
    // W1's 32 tokens): a panel is then 64 bytes of each of W's k rows, 0.5-6 KiB apart, and
    // packing it waited on them in turn (twice as long as with W in cache). Such a block is
    // packed first by pack_panels, each k row read whole (W1 bf16 dx -20 to -24 %), or, where
    // the kernel set can and K is even (bip16), not packed at all: the kernel reads each slot's
    // two k rows of W and interleaves them (W1 bf16 backward products -8 to -10 %, the step -3
    // to -4.5 %, the same bits).
    const bool stream = m1 - m0 <= MC && (SL == Slot::f32 || B.rs != 1 || bip_rows);
    // fp32 split sums over at most two blocks of rows (the SGD products of wo and w2: 256
    // rows, B the 16-24 MiB x): the first block packs B as it goes. W2 fp32 wo, w2 SGD
    // products -5 to -9 %; no gain measured where more blocks of rows share the packed B
    // (w13, qkv) nor in bf16 (its chunked packs already fetch ahead).
    const bool lazy = split && !stream && SL == Slot::f32 && m1 - m0 <= 2 * MC;
    const int64_t jc_last = last_jc(n0, n1), pc_last = (S - 1) / KCB * KCB;
    const bool queue = !queues.empty() && !stream && !finish && n1 > n0;
    for (int64_t jc = n0; jc < n1; jc += NCB) {
      const int64_t nc = lo(NCB, n1 - jc);
      for (int64_t icf = m0; icf < (finish ? m1 : m0 + 1); icf += MC)  // finish: rows outside
        for (int64_t pc = 0; pc < S; pc += KCB) {
          const int64_t kc = lo(KCB, S - pc);
          // Several blocks of rows: pack the B block once for all of them.
          if (!stream && !lazy) Kern::template pack_panels<SL>(Bp, B, N, K, jc, nc, NR, pc, kc);
          if (queue && jc == jc_last && pc == pc_last) {
            // (packing lazily, the owner's first rows pack B before others may take any)
            StealQueue& q = queues[size_t(t)];
            const int64_t first = lazy ? lo(MC, m1 - m0) : 0;
            if (lazy) rows(m0, first, Bp, jc, nc, pc, kc, false, true);
            q.open(first / MR, (m1 - m0 + MR - 1) / MR);
            for (int64_t p0, np; q.take_front(MC / MR, p0, np);)
              rows(m0 + p0 * MR, lo(np * MR, m1 - m0 - p0 * MR), Bp, jc, nc, pc, kc, false, false);
            continue;
          }
          for (int64_t ic = finish ? icf : m0; ic < (finish ? lo(m1, icf + MC) : m1); ic += MC)
            rows(ic, lo(MC, m1 - ic), Bp, jc, nc, pc, kc, stream, lazy && ic == m0);
        }
    }
    if (queues.empty()) return;
    queues[size_t(t)].close();
    int spins = 0;
    // Then the others' queues, from the back: their rows of their last block, with their B.
    // (More threads than cores: an owner not yet at its last block may be waiting for this
    // core, so after a short spin the wait yields it.)
    for (bool pending = true; pending;) {
      pending = false;
      bool idle = true;
      for (int d = 1; d < nt; ++d) {
        const int v = (t + d) % nt;
        StealQueue& q = queues[size_t(v)];
        int64_t p0, np;
        if (q.take_back(MC / MR, p0, np)) {
          int64_t vm0, vm1, vn0, vn1;
          band_of(v, nt, vm0, vm1, vn0, vn1);
          const int64_t jc = last_jc(vn0, vn1);
          // (split by rows, the owner's last B block is this thread's own, if it packed one:
          // read it from here)
          const uint32_t* Bv = queue && vn0 == n0 && vn1 == n1 ? Bp : ws + per_thread * v;
          rows(vm0 + p0 * MR, lo(np * MR, vm1 - vm0 - p0 * MR), Bv, jc, lo(NCB, vn1 - jc), pc_last,
               lo(KCB, S - pc_last), false, false);
          pending = true, idle = false, spins = 0;
        } else if (q.waiting()) {
          pending = true;
        }
      }
      if (pending && idle && ++spins > 2000) std::this_thread::yield();
      if (pending && idle) _mm_pause();
    }
  };
  if (serial) return band(0, 1);
#pragma omp parallel
  band(omp_get_thread_num(), omp_get_num_threads());
}

// The optax bf16 step: alpha is bf16(-lr), as fp32.
template <class Kern>
void gemm_sgd16(int64_t M, int64_t N, int64_t K, View A, View B, uint16_t* W, int64_t ldw,
                float lr) {
  const uint32_t step = uint32_t(to_bf16(-lr)) << 16;
  float alpha;
  std::memcpy(&alpha, &step, 4);
  gemm<Kern, true, true>(M, N, K, A, B, reinterpret_cast<float*>(W), ldw, true, alpha, Store::f32);
}

// gemm_f32_dx_sgd, gemm_bf16_dx_sgd. With few tokens (W1's 32), dx = dout W splits W's columns
// between the threads where W has too few rows to split them into k blocks (nb of them; wo, w2:
// 256 rows), and so does the SGD product after it. Then each thread takes both products a chunk
// of columns at a time, so that the SGD step updates lines of W that its core has just read for
// dx (in L2). Over the whole of W one after the other, the SGD products of wo and w2 in a W1
// fp32 backward ran ~1.5x slower than alone, and only ~1.3x faster on 2 threads than on 1 (on
// the Zen 5 VM). By chunks, the step's matmul_backward_sgd took 15.0-15.8 instead of 17.5-17.9
// ms, the step 28-30 instead of 31.5 ms. (qkv and w13, W's rows split, measured slower by
// chunks.) The same sums: the same bits. both(c0, cn): the two products on columns c0..c0+cn;
// S: dx's slots (W's rows, in k slots of the kind), whose k blocks decide gemm()'s split.
template <class Both>
void dx_sgd(int64_t M, int64_t S, int64_t IC, const Both& both) {
  const bool serial = omp_in_parallel() || omp_get_max_threads() == 1;
  const int nthreads = serial ? 1 : omp_get_max_threads();
  constexpr int64_t CB = 256;  // columns per chunk: W's rows x CB in L2 between the two products
  const int64_t chunks = (IC + CB - 1) / CB;
  if (serial || M > MC || k_blocks(S) >= 2 * nthreads || chunks < nthreads) return both(0, IC);
#pragma omp parallel num_threads(nthreads)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    for (int64_t c = chunks * t / n; c < chunks * (t + 1) / n; ++c)
      both(c * CB, lo(CB, IC - c * CB));
  }
}
// F: the set's fp32 product; kChunks: whether to take it by chunks as above (the AVX2 set's dx at
// few tokens is gemm_wt, split its own way: not measured there, so not chunked).
template <GemmFn F, bool kChunks>
void gemm_dx_sgd(int64_t M, int64_t OC, int64_t IC, const float* dout, const float* x, float* W,
                 float* dx, float lr) {
  const auto both = [&](int64_t c0, int64_t cn) {
    F(M, cn, OC, {dout, false, OC, 1}, {W + c0, false, 1, IC}, dx + c0, IC, false, 1.0f,
      Store::f32);
    F(OC, cn, M, {dout, false, 1, OC}, {x + c0, false, 1, IC}, W + c0, IC, true, -lr, Store::f32);
  };
  if (!kChunks) return both(0, IC);
  dx_sgd(M, OC, IC, both);
}
// The bf16 kind: F its product, FS its SGD step, per its k slot's width (kChunks as above).
template <GemmFn F, GemmSgdFn FS, int64_t per, bool kChunks>
void gemm_dx_sgd16(int64_t M, int64_t OC, int64_t IC, View d, View dt, View x, uint16_t* W,
                   void* dx, Store st, float lr) {
  const auto both = [&](int64_t c0, int64_t cn) {
    float* dc = st == Store::bf16 ? reinterpret_cast<float*>(static_cast<uint16_t*>(dx) + c0)
                                  : static_cast<float*>(dx) + c0;
    const View xc{static_cast<const char*>(x.p) + c0 * x.rs * (x.bf16 ? 2 : 4), x.bf16, x.rs, x.ks};
    F(M, cn, OC, d, {W + c0, true, 1, IC}, dc, IC, false, 1.0f, st);
    FS(OC, cn, M, dt, xc, W + c0, IC, lr);
  };
  if (!kChunks) return both(0, IC);
  dx_sgd(M, (OC + per - 1) / per, IC, both);
}

}  // namespace
}  // namespace tq::cpu
