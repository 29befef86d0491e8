// Our packed products (src/cpu/gemm.h), every kernel set this CPU can run (AVX2, AVX-512),
// against a plain double-precision sum, over many shapes (odd, smaller and larger than a
// tile or block), every operand layout the model uses plus a general strided one, fp32 and
// bf16 sources, overwrite and accumulate; results must not depend on the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/common.h"
#include "cpu/gemm.h"
#include "cpu/layers.h"
#include "model/ops.h"
#include "testing.h"

namespace tq {
namespace {

enum class Layout { kcontig, rcontig, strided };

// A (rows x K) matrix stored in one of the layouts, as fp32 or bf16 bits.
struct Operand {
  std::vector<float> f;     // fp32 storage
  std::vector<uint16_t> h;  // bf16 storage
  std::vector<double> val;  // the value each (i, k) holds, row-major
  cpu::View view;
};
Operand make(int64_t rows, int64_t K, Layout lay, bool bf16src, bool bf16vals, uint32_t seed) {
  Operand o;
  const std::vector<double> v = test::randn(size_t(rows * K), seed);
  int64_t rs, ks, size;
  switch (lay) {
    case Layout::kcontig:
      rs = K, ks = 1, size = rows * K;
      break;
    case Layout::rcontig:
      rs = 1, ks = rows, size = rows * K;
      break;
    default:
      rs = 3 * K + 1, ks = 2, size = rows * (3 * K + 1);
      break;  // padded rows, gaps
  }
  o.f.assign(size_t(size), 1e30f);  // untouched slots would poison the result
  o.h.assign(size_t(size), f32_to_bf16(1e30f));
  o.val.resize(size_t(rows * K));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t k = 0; k < K; ++k) {
      float x = float(v[size_t(i * K + k)]);
      if (bf16vals || bf16src) x = round_bf16(x);
      o.f[size_t(i * rs + k * ks)] = x;
      o.h[size_t(i * rs + k * ks)] = f32_to_bf16(x);
      o.val[size_t(i * K + k)] = x;
    }
  o.view = {bf16src ? static_cast<const void*>(o.h.data()) : o.f.data(), bf16src, rs, ks};
  return o;
}

// The kernel sets this CPU runs; says which it cannot.
std::vector<const cpu::GemmSet*> usable_sets() {
  std::vector<const cpu::GemmSet*> sets;
  for (cpu::Isa isa : {cpu::Isa::avx2, cpu::Isa::avx512}) {
    if (const cpu::GemmSet* s = cpu::gemm_set(isa))
      sets.push_back(s);
    else
      std::printf("[ SKIPPED  ] %s kernels: not on this CPU\n",
                  isa == cpu::Isa::avx2 ? "avx2" : "avx512");
  }
  return sets;
}
#define FOR_EACH_SET(set)                                                                    \
  const auto sets_ = usable_sets();                                                          \
  if (sets_.empty()) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512: OpenBLAS runs"; \
  for (const cpu::GemmSet* set : sets_)

struct Case {
  int64_t M, N, K;
};
const Case kCases[] = {{1, 1, 1},
                       {1, 33, 7},
                       {5, 17, 3},
                       {12, 32, 64},
                       {13, 33, 65},
                       {32, 256, 256},
                       {31, 70, 385},
                       {100, 50, 2},
                       {24, 800, 40},
                       {7, 1600, 33},
                       {40, 64, 1000},
                       {33, 48, 2600},  // few rows, many k blocks: split by k blocks
                       {257, 97, 129},
                       {300, 70, 40},     // short sums over more rows
                                          // than a block: C by rows
                       {400, 40, 600},    // row bands of several blocks a thread
                       {450, 100, 300}};  // (two k blocks)

void run_set(const cpu::GemmSet& set, bool bf16) {
  const auto gemm = bf16 ? set.bf16 : set.f32;
  uint32_t seed = 1;

  for (const Case& c : kCases)
    for (Layout la : {Layout::kcontig, Layout::rcontig, Layout::strided})
      for (Layout lb : {Layout::kcontig, Layout::rcontig, Layout::strided})
        for (int src = 0; src < 4; ++src) {
          const bool abf = src & 1, bbf = src & 2;
          const Operand A = make(c.M, c.K, la, abf, bf16, seed++);
          const Operand B = make(c.N, c.K, lb, bbf, bf16, seed++);
          const int64_t ldc = c.N + 3;
          const std::vector<double> c0 = test::randn(size_t(c.M * ldc), seed++);
          for (bool acc : {false, true}) {
            std::vector<float> C(c0.begin(), c0.end()), C1;
            for (int threads : {2, 1}) {
              omp_set_num_threads(threads);
              std::vector<float> out(c0.begin(), c0.end());
              gemm(c.M, c.N, c.K, A.view, B.view, out.data(), ldc, acc, 1.0f, cpu::Store::f32);
              if (threads == 2)
                C = out;
              else
                C1 = out;
            }
            omp_set_num_threads(cpu::threads());
            const std::string what = std::string(set.name) + ": M=" + std::to_string(c.M) +
                                     " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                                     " layouts " + std::to_string(int(la)) +
                                     std::to_string(int(lb)) + " bf16 sources " +
                                     std::to_string(src) + (acc ? " accumulate" : "");
            ASSERT_EQ(C, C1) << what << ": differs between 1 and 2 threads";
            for (int64_t m = 0; m < c.M; ++m)
              for (int64_t n = 0; n < ldc; ++n) {
                const float got = C[size_t(m * ldc + n)];
                if (n >= c.N) {  // the padding of each C row is never written
                  ASSERT_EQ(got, float(c0[size_t(m * ldc + n)])) << what;
                  continue;
                }
                double want = acc ? double(float(c0[size_t(m * ldc + n)])) : 0.0, mag = 0;
                for (int64_t k = 0; k < c.K; ++k) {
                  const double p = A.val[size_t(m * c.K + k)] * B.val[size_t(n * c.K + k)];
                  want += p;
                  mag += std::fabs(p);
                }
                // fp32 sums of exact products, any order: |error| <= (K + 1) u sum |terms|
                const double bound = double(c.K + 2) * 6e-8 *
                                     (mag + (acc ? std::fabs(c0[size_t(m * ldc + n)]) : 0.0));
                ASSERT_NEAR(got, want, bound + 1e-30) << what << " at (" << m << ", " << n << ")";
              }
          }
        }
}

void run(bool bf16) {
  FOR_EACH_SET(set) run_set(*set, bf16);
}

TEST(Gemm, F32MatchesPlainSumsOverShapesAndLayouts) {
  run(false);
}
TEST(Gemm, Bf16MatchesPlainSumsOverShapesAndLayouts) {
  run(true);
}

// Few rows against k-contiguous weights take gemm_skinny (the roles swapped), and on AVX2 dx =
// dout W (row-contiguous weights of the kind's type) takes gemm_wt; the rows either computes are
// bit for bit those of the general path, which a taller A takes: both kinds, fp32 and bf16
// weights, each of gemm_wt's token widths (8, 16, 24, 32).
TEST(Gemm, SkinnyProductsMatchTheGeneralPathBitForBit) {
  FOR_EACH_SET(set) {
    uint32_t seed = 7;
    for (int64_t M : {1, 9, 17, 32, 64})
      for (int64_t N : {7, 256, 1030})
        for (int64_t K : {3, 256, 3072})
          for (Layout lb : {Layout::kcontig, Layout::rcontig})
            for (int kind = 0; kind < 4; ++kind) {
              const bool bf16 = kind & 1, bsrc = kind & 2;
              const auto gemm = bf16 ? set->bf16 : set->f32;
              const int64_t tall = 100;
              const Operand A = make(tall, K, Layout::kcontig, false, false, seed++);
              const Operand B = make(N, K, lb, bsrc, false, seed++);
              // each way of storing C (bf16 storage: the bf16 kind only; C then holds uint16_t)
              for (cpu::Store st : {cpu::Store::f32, cpu::Store::round, cpu::Store::bf16}) {
                if (st == cpu::Store::bf16 && !bf16) continue;
                std::vector<float> all(size_t(tall * N)), few(size_t(M * N));
                gemm(tall, N, K, A.view, B.view, all.data(), N, false, 1.0f, st);
                gemm(M, N, K, A.view, B.view, few.data(), N, false, 1.0f, st);
                const size_t bytes = size_t(M * N) * (st == cpu::Store::bf16 ? 2 : 4);
                ASSERT_EQ(std::memcmp(few.data(), all.data(), bytes), 0)
                    << set->name << ": M=" << M << " N=" << N << " K=" << K << " layout " << int(lb)
                    << " bf16 kind " << bf16 << " bf16 weights " << bsrc << " store " << int(st);
              }
            }
  }
}

// The GEMV path (gemm.h: at most kGemvRows rows of A against W's contiguous rows) on every kernel
// set, against plain double sums: both kinds (the bf16 kind's fp32 A rounded to bf16 by the
// kernels), A in fp32 and bf16 storage, every Store mode, overwrite, accumulate and alpha, at
// sizes off every vector width and unroll (K 1..1024: inside one vector, odd, a masked last step;
// N from one row to several groups of R). Tolerance: an fp32 sum of exact products in any order,
// |error| <= (K + 2) u sum |terms| (u = 2^-24, as above), then alpha's and the store's rounding
// (half a bf16 ulp, 2^-9 relative, for Store::round and Store::bf16).
TEST(Gemm, GemvMatchesPlainSums) {
  FOR_EACH_SET(set) {
    uint32_t seed = 1200;
    for (int64_t M : {1, 2, 3, 5, 8})
      for (int64_t K : {1, 7, 64, 129, 1024})
        for (int64_t N : {1, 3, 17, 256, 1000})
          for (int kind = 0; kind < 4; ++kind) {
            const bool bf16 = kind & 1, a16 = kind & 2;
            // A's values not bf16 where stored in fp32: the bf16 kind must round them itself
            const Operand A = make(M, K, Layout::kcontig, a16, false, seed++);
            const Operand B = make(N, K, Layout::kcontig, bf16, bf16, seed++);
            ASSERT_TRUE(cpu::gemv_fits(bf16, M, N, K, A.view, B.view));
            ASSERT_FALSE(cpu::gemv_fits(!bf16, M, N, K, A.view, B.view));
            std::vector<double> want(size_t(M * N)), mag(size_t(M * N));
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < N; ++n)
                for (int64_t k = 0; k < K; ++k) {
                  double a = A.val[size_t(m * K + k)];
                  if (bf16) a = round_bf16(float(a));
                  const double p = a * B.val[size_t(n * K + k)];
                  want[size_t(m * N + n)] += p, mag[size_t(m * N + n)] += std::fabs(p);
                }
            const auto gemv = bf16 ? set->gemv_bf16 : set->gemv_f32;
            const int64_t ldc = N + 5;
            const std::vector<double> c0 = test::randn(size_t(M * ldc), seed++);
            for (cpu::Store st : {cpu::Store::f32, cpu::Store::round, cpu::Store::bf16})
              for (int op = 0; op < 4; ++op) {  // overwrite, accumulate, alpha, both
                const bool acc = op & 1, c16 = st == cpu::Store::bf16;
                const float alpha = op & 2 ? -0.375f : 1.0f;
                if (c16 && (!bf16 || op > 0)) continue;  // (gemm.h)
                std::vector<float> C(c0.begin(), c0.end());
                std::vector<uint16_t> C16(size_t(M * ldc), 0x7fc1);
                gemv(M, N, K, A.view, B.view, c16 ? reinterpret_cast<float*>(C16.data()) : C.data(),
                     ldc, acc, alpha, st);
                const std::string what = std::string(set->name) + ": M=" + std::to_string(M) +
                                         " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                                         (bf16 ? " bf16" : " f32") + " kind, A in " +
                                         (a16 ? "bf16" : "fp32") + ", store " +
                                         std::to_string(int(st)) + ", op " + std::to_string(op);
                for (int64_t m = 0; m < M; ++m)
                  for (int64_t n = 0; n < ldc; ++n) {
                    const size_t i = size_t(m * ldc + n);
                    const float got = c16 ? bf16_to_f32(C16[i]) : C[i];
                    if (n >= N) {  // the padding of each C row is never written
                      if (c16) {
                        ASSERT_EQ(C16[i], 0x7fc1) << what;
                      } else {
                        ASSERT_EQ(C[i], float(c0[i])) << what;
                      }
                      continue;
                    }
                    const double c = acc ? double(float(c0[i])) : 0.0,
                                 w = alpha * want[size_t(m * N + n)] + c;
                    double bound = double(K + 2) * 6e-8 *
                                       (std::fabs(alpha) * mag[size_t(m * N + n)] + std::fabs(c)) +
                                   1e-30;
                    if (st != cpu::Store::f32) {
                      bound += std::fabs(w) / 256;
                      ASSERT_EQ(got, round_bf16(got)) << what;
                    }
                    ASSERT_NEAR(got, w, bound) << what << " at (" << m << ", " << n << ")";
                  }
              }
          }
  }
}

// The GEMV path's bits do not depend on the thread count (1, 2, 3: a band of several groups
// each, N and K off every width) nor on the other rows of A (each row of an 8-row product is
// that row's product alone: a sequence's logits do not depend on what it is decoded beside);
// and gemm_f32 / gemm_bf16 take it up to kGemvRows rows and the packed path beyond, with the
// packed path's bits there.
TEST(Gemm, GemvBitsDoNotDependOnThreadsOrOtherRows) {
  FOR_EACH_SET(set) {
    uint32_t seed = 1300;
    for (const Case& c : {Case{8, 4099, 129}, Case{5, 1000, 1024}, Case{3, 700, 2050}})
      for (int kind = 0; kind < 4; ++kind) {
        const bool bf16 = kind & 1, a16 = kind & 2;
        const auto gemv = bf16 ? set->gemv_bf16 : set->gemv_f32;
        const cpu::Store st = bf16 ? cpu::Store::round : cpu::Store::f32;
        const Operand A = make(c.M, c.K, Layout::kcontig, a16, false, seed++);
        const Operand B = make(c.N, c.K, Layout::kcontig, bf16, bf16, seed++);
        const std::string what = std::string(set->name) + ": M=" + std::to_string(c.M) +
                                 " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                                 " kind " + std::to_string(kind);
        std::vector<float> one;
        for (int threads : {1, 2, 3}) {
          omp_set_num_threads(threads);
          std::vector<float> C(size_t(c.M * c.N), 1e30f);
          gemv(c.M, c.N, c.K, A.view, B.view, C.data(), c.N, false, 1.0f, st);
          if (threads == 1)
            one = C;
          else
            ASSERT_EQ(std::memcmp(C.data(), one.data(), C.size() * 4), 0)
                << what << ": differs between 1 and " << threads << " threads";
        }
        omp_set_num_threads(cpu::threads());
        const int64_t es = a16 ? 2 : 4;
        for (int64_t m = 0; m < c.M; ++m) {
          const cpu::View row{static_cast<const char*>(A.view.p) + m * c.K * es, a16, c.K, 1};
          std::vector<float> C(size_t(c.N));
          gemv(1, c.N, c.K, row, B.view, C.data(), c.N, false, 1.0f, st);
          ASSERT_EQ(std::memcmp(C.data(), one.data() + m * c.N, C.size() * 4), 0)
              << what << ": row " << m << " alone";
        }
      }
  }
  // the dispatch, on the set in use (TQ_CPU=avx2 caps it)
  const char* cap = std::getenv("TQ_CPU");
  if (!cpu::own_kernels()) GTEST_SKIP() << "no AVX2/AVX-512 kernels in use: OpenBLAS runs";
  const cpu::GemmSet* set =
      cap && std::string(cap) == "avx2" ? nullptr : cpu::gemm_set(cpu::Isa::avx512);
  if (!set) set = cpu::gemm_set(cpu::Isa::avx2);
  uint32_t seed = 1400;
  for (int64_t M : {int64_t(1), cpu::kGemvRows, cpu::kGemvRows + 1})
    for (bool bf16 : {false, true}) {
      const int64_t N = 300, K = 200;
      const Operand A = make(M, K, Layout::kcontig, false, false, seed++);
      const Operand B = make(N, K, Layout::kcontig, bf16, bf16, seed++);
      std::vector<float> C(size_t(M * N)), want(C.size());
      if (bf16)
        cpu::gemm_bf16(M, N, K, A.view, B.view, C.data(), N, false);
      else
        cpu::gemm_f32(M, N, K, A.view, B.view, C.data(), N, false);
      const auto path = M <= cpu::kGemvRows ? (bf16 ? set->gemv_bf16 : set->gemv_f32)
                                            : (bf16 ? set->bf16 : set->f32);
      path(M, N, K, A.view, B.view, want.data(), N, false, 1.0f, cpu::Store::f32);
      ASSERT_EQ(std::memcmp(C.data(), want.data(), C.size() * 4), 0)
          << set->name << ": M=" << M << (bf16 ? " bf16" : " f32");
    }
}

// A product whose packing buffer cannot be allocated says so in one line and exits 2, before
// it reads its operands (a skinny product over 2^44 slots asks for ~2^51 bytes). Not under
// ASan, whose allocator reports such a request itself.
TEST(Gemm, OutOfMemoryForItsBufferIsAnErrorNotACrash) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan's allocator fails the request first";
#else
  ::testing::GTEST_FLAG(death_test_style) = "threadsafe";  // OpenMP's threads may be running
  FOR_EACH_SET(set) {
    float a = 1.0f, b = 1.0f, c = 0.0f;
    const int64_t K = int64_t(1) << 44;
    const cpu::View A{&a, false, K, 1}, B{&b, false, K, 1};
    EXPECT_EXIT(set->f32(1, 1, K, A, B, &c, 1, false, 1.0f, cpu::Store::f32),
                testing::ExitedWithCode(2), "error: out of memory: the CPU kernels' packing buffer")
        << set->name;
  }
#endif
}

// Row bands of several blocks a thread over more columns than one B block: bit for bit the
// band of one thread, and the plain sums.
TEST(Gemm, RowBandsOverSeveralColumnBlocks) {
  FOR_EACH_SET(set) {
    uint32_t seed = 11;
    const int64_t M = 1200, N = 3100, K = 6;
    for (Layout la : {Layout::kcontig, Layout::rcontig})
      for (bool bf16 : {false, true}) {
        const auto gemm = bf16 ? set->bf16 : set->f32;
        const Operand A = make(M, K, la, false, bf16, seed++);
        const Operand B = make(N, K, Layout::kcontig, false, bf16, seed++);
        std::vector<float> C[2];
        for (int threads : {2, 1}) {
          omp_set_num_threads(threads);
          C[threads - 1].assign(size_t(M * N), 0.0f);
          gemm(M, N, K, A.view, B.view, C[threads - 1].data(), N, false, 1.0f, cpu::Store::f32);
        }
        omp_set_num_threads(cpu::threads());
        const std::string what = std::string(set->name) + (bf16 ? " bf16" : " f32") + " layout " +
                                 std::to_string(int(la));
        ASSERT_EQ(C[0], C[1]) << what << ": differs between 1 and 2 threads";
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            double want = 0, mag = 0;
            for (int64_t k = 0; k < K; ++k) {
              const double p = A.val[size_t(m * K + k)] * B.val[size_t(n * K + k)];
              want += p, mag += std::fabs(p);
            }
            ASSERT_NEAR(C[1][size_t(m * N + n)], want, double(K + 2) * 6e-8 * mag + 1e-30)
                << what << " at (" << m << ", " << n << ")";
          }
      }
  }
}

// The L1 rule of the narrow in-place path: a tile's rows (one set) beside a B panel's lines in
// that set must fit its ways. Zen 5 (48 KiB, 12 ways): the AVX2 set (6 rows, 16 KiB panel: 10
// lines) fits, AVX-512 (12 rows, 32 KiB: 20) does not; a 32 KiB 8-way L1d fits neither; an
// unknown L1d packs.
TEST(Gemm, NarrowInPlaceRuleCountsTheLinesOfOneSet) {
  EXPECT_TRUE(cpu::narrow_fits_l1(6, 16 * 256 * 4, 48 << 10, 12));
  EXPECT_FALSE(cpu::narrow_fits_l1(12, 32 * 256 * 4, 48 << 10, 12));
  EXPECT_FALSE(cpu::narrow_fits_l1(6, 16 * 256 * 4, 32 << 10, 8));
  EXPECT_FALSE(cpu::narrow_fits_l1(12, 32 * 256 * 4, 32 << 10, 8));
  EXPECT_TRUE(cpu::narrow_fits_l1(8, 16 << 10, 48 << 10, 12));   // 8 + 4 = 12: just fits
  EXPECT_FALSE(cpu::narrow_fits_l1(9, 16 << 10, 48 << 10, 12));  // 13
  EXPECT_FALSE(cpu::narrow_fits_l1(6, 16 << 10, 0, 12));
  EXPECT_FALSE(cpu::narrow_fits_l1(6, 16 << 10, 48 << 10, 0));
}

// Where a block of A serves at most 256 columns (N <= 256 and more rows than one block) and its
// rows are contiguous in k, the kernels read A in place instead of packing it (where the L1d
// holds a tile's rows beside a B panel; forced on here): the same bits as the packed path, which
// the same values in a strided layout take. fp32 (accumulated too) and bf16 storage stored as bf16
// (its pairs in place; an odd K packs), at 1 and 3 threads, with a wider N that packs either way.
TEST(Gemm, NarrowProductsReadAInPlaceWithTheSameBits) {
  cpu::force_narrow_a_in_place(true);
  struct Restore {
    ~Restore() { cpu::force_narrow_a_in_place(false); }
  } restore;
  FOR_EACH_SET(set) {
    uint32_t seed = 900;
    const Case cases[] = {{400, 40, 600}, {300, 256, 1100}, {450, 257, 300}, {290, 33, 513}};
    for (const Case& c : cases)
      for (int kind = 0; kind < 3; ++kind) {  // fp32; fp32 accumulated; bf16 storage
        const bool h16 = kind == 2, acc = kind == 1;
        const Operand A = make(c.M, c.K, Layout::kcontig, h16, h16, seed);
        const Operand As = make(c.M, c.K, Layout::strided, h16, h16, seed++);
        const Operand B = make(c.N, c.K, Layout::kcontig, h16, h16, seed++);
        const std::vector<double> c0 = test::randn(size_t(c.M * c.N), seed++);
        for (int threads : {1, 3}) {
          omp_set_num_threads(threads);
          std::vector<float> in(c0.begin(), c0.end()), packed(c0.begin(), c0.end());
          if (h16) {
            set->bf16(c.M, c.N, c.K, A.view, B.view, in.data(), c.N, false, 1.0f, cpu::Store::bf16);
            set->bf16(c.M, c.N, c.K, As.view, B.view, packed.data(), c.N, false, 1.0f,
                      cpu::Store::bf16);
          } else {
            set->f32(c.M, c.N, c.K, A.view, B.view, in.data(), c.N, acc, 1.0f, cpu::Store::f32);
            set->f32(c.M, c.N, c.K, As.view, B.view, packed.data(), c.N, acc, 1.0f,
                     cpu::Store::f32);
          }
          ASSERT_EQ(std::memcmp(in.data(), packed.data(), in.size() * 4), 0)
              << set->name << ": M=" << c.M << " N=" << c.N << " K=" << c.K << " kind " << kind
              << ", " << threads << " threads";
        }
        omp_set_num_threads(cpu::threads());
      }
  }
}

// The backward with the SGD step fused (matmul_backward_sgd, _bf16w) is its two products bit for
// bit: dx = dout W, then the SGD step on W, at 1 thread against 1, 2, 3 and 5 threads; fp32, and
// the bf16 kind with bf16 weights, dx stored in each way, dout and x in fp32 or bf16 storage.
// Shapes taken by chunks of W's columns (wo and w2 at W1's 32 tokens; a short last chunk; W of
// several k blocks, too few to split), and the two products as they are (W's rows split into k
// blocks, fewer chunks than threads, more tokens than one block of rows, odd sizes).
TEST(Gemm, FusedDxAndSgdStepAreTheTwoProducts) {
  FOR_EACH_SET(set) {
    uint32_t seed = 700;
    const Case cases[] = {{32, 256, 2048}, {32, 256, 1030},  {32, 600, 2048}, {32, 256, 300},
                          {32, 4096, 256}, {150, 256, 1024}, {5, 100, 777},   {1, 7, 513}};
    for (const Case& c : cases)  // M tokens, N = OC, K = IC
      for (int kind = 0; kind < 5; ++kind) {
        // 0: fp32; bf16 kind: 1-3 dx stored f32, rounded, bf16 (activations in fp32); 4: dx, dout
        // and x in bf16 storage
        const int64_t M = c.M, OC = c.N, IC = c.K;
        const bool bf = kind > 0, h16 = kind == 4;
        const cpu::Store st = kind == 1   ? cpu::Store::f32
                              : kind == 2 ? cpu::Store::round
                                          : cpu::Store::bf16;
        const Operand dout = make(M, OC, Layout::kcontig, h16, bf, seed++);
        const Operand xT = make(IC, M, Layout::rcontig, h16, bf, seed++);  // x [M, IC] as [IC, M]
        const cpu::View dT{dout.view.p, h16, 1, OC};
        const std::vector<double> w0 = test::randn(size_t(OC * IC), seed++);
        std::vector<float> W(w0.begin(), w0.end()), dx(size_t(M * IC), 1e30f);  // (as dx2)
        std::vector<uint16_t> W16(W.size());
        for (size_t i = 0; i < W.size(); ++i) W16[i] = f32_to_bf16(W[i]);
        omp_set_num_threads(1);
        if (!bf) {
          set->f32(M, IC, OC, dout.view, {W.data(), false, 1, IC}, dx.data(), IC, false, 1.0f,
                   cpu::Store::f32);
          set->f32(OC, IC, M, dT, xT.view, W.data(), IC, true, -0.01f, cpu::Store::f32);
        } else {
          set->bf16(M, IC, OC, dout.view, {W16.data(), true, 1, IC}, dx.data(), IC, false, 1.0f,
                    st);
          set->bf16_sgd(OC, IC, M, dT, xT.view, W16.data(), IC, 0.01f);
        }
        for (int threads : {1, 2, 3, 5}) {
          omp_set_num_threads(threads);
          std::vector<float> W2(w0.begin(), w0.end()), dx2(dx.size(), 1e30f);
          std::vector<uint16_t> W216(W2.size());
          for (size_t i = 0; i < W2.size(); ++i) W216[i] = f32_to_bf16(W2[i]);
          if (!bf)
            set->f32_dx_sgd(M, OC, IC, static_cast<const float*>(dout.view.p),
                            static_cast<const float*>(xT.view.p), W2.data(), dx2.data(), 0.01f);
          else
            set->bf16_dx_sgd(M, OC, IC, dout.view, dT, xT.view, W216.data(), dx2.data(), st, 0.01f);
          omp_set_num_threads(cpu::threads());
          const std::string what = std::string(set->name) + ": M=" + std::to_string(M) +
                                   " OC=" + std::to_string(OC) + " IC=" + std::to_string(IC) +
                                   " kind " + std::to_string(kind) + ", " +
                                   std::to_string(threads) + " threads";
          ASSERT_EQ(dx2, dx) << what << ": dx";
          ASSERT_EQ(W2, W) << what << ": W";
          ASSERT_EQ(W216, W16) << what << ": W (bf16)";
        }
      }
  }
}

// Where oneDNN takes the fp32 dx of many tokens (cpu::library_dx): gemm_f32_dx_sgd's dx is the
// product within the bound of any fp32 order and repeats bit for bit at a thread count, and its
// SGD step is our kernels' bit for bit (it reads W before the step). At fewer tokens than
// kLibraryDxRows, our fused kernels: the bits of the two products.
TEST(Gemm, LibraryDxIsTheProductAndTheSgdStepOurs) {
  if (!cpu::own_kernels() || !cpu::library_dx())
    GTEST_SKIP() << "oneDNN's sgemm not in use here (" << cpu::kernels_name()
                 << "): fp32 dx on our kernels";
  const cpu::GemmSet* set = cpu::gemm_set(cpu::Isa::avx512);
  ASSERT_NE(set, nullptr);
  uint32_t seed = 900;
  const Case cases[] = {{cpu::kLibraryDxRows, 256, 1024},
                        {300, 1030, 200},
                        {1000, 64, 1500},
                        {2048, 256, 3072},
                        {cpu::kLibraryDxRows - 1, 256, 300}};
  for (const Case& c : cases) {  // M tokens, N = OC, K = IC
    const int64_t M = c.M, OC = c.N, IC = c.K;
    const Operand dout = make(M, OC, Layout::kcontig, false, false, seed++);
    const Operand xT = make(IC, M, Layout::rcontig, false, false, seed++);
    const cpu::View dT{dout.view.p, false, 1, OC};
    const std::vector<double> w0 = test::randn(size_t(OC * IC), seed++);
    std::vector<float> W(w0.begin(), w0.end()), dx(size_t(M * IC), 1e30f);
    set->f32(M, IC, OC, dout.view, {W.data(), false, 1, IC}, dx.data(), IC, false, 1.0f,
             cpu::Store::f32);
    set->f32(OC, IC, M, dT, xT.view, W.data(), IC, true, -0.01f, cpu::Store::f32);
    const std::string what =
        "M=" + std::to_string(M) + " OC=" + std::to_string(OC) + " IC=" + std::to_string(IC);
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      std::vector<float> W2(w0.begin(), w0.end()), dx2(dx.size(), 1e30f);
      cpu::gemm_f32_dx_sgd(M, OC, IC, static_cast<const float*>(dout.view.p),
                           static_cast<const float*>(xT.view.p), W2.data(), dx2.data(), 0.01f);
      ASSERT_EQ(W2, W) << what << ": the SGD step";
      if (M < cpu::kLibraryDxRows) {
        ASSERT_EQ(dx2, dx) << what << ": our fused kernels";
        break;
      }
      if (run == 1) {
        ASSERT_EQ(dx2, first) << what << ": dx differs between two runs";
        break;
      }
      first = dx2;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t i = 0; i < IC; ++i) {
          double want = 0, mag = 0;
          for (int64_t o = 0; o < OC; ++o) {
            const double p = dout.val[size_t(m * OC + o)] * w0[size_t(o * IC + i)];
            want += p, mag += std::fabs(p);
          }
          ASSERT_NEAR(dx2[size_t(m * IC + i)], want, double(OC + 2) * 6e-8 * mag + 1e-30)
              << what << ": dx at (" << m << ", " << i << ")";
        }
    }
  }
}

// oneDNN's sgemm failing (a non-zero status, after writing some of dx): one warning line for the
// process, then dx and the SGD step on our fused kernels, with their bits. Fed by a stand-in
// sgemm, so it runs wherever the AVX-512 set does, oneDNN installed or not (the sanitizer build).
TEST(Gemm, LibraryDxFailureFallsBackToOurKernels) {
  const cpu::GemmSet* set = cpu::gemm_set(cpu::Isa::avx512);
  const std::string kernels = cpu::kernels_name();
  if (!cpu::own_kernels() || !set || kernels.rfind("avx512", 0) != 0)
    GTEST_SKIP() << "the AVX-512 set is not in use here (" << kernels << "): no library dx";
  static int failed = 0;
  const cpu::Sgemm failing = [](char, char, int64_t M, int64_t N, int64_t, float, const float*,
                                int64_t, const float*, int64_t, float, float* C,
                                int64_t ldc) -> int {
    ++failed;
    for (int64_t m = 0; m < M; m += 7) C[m * ldc + m % N] = std::nanf("");
    return 3;
  };
  const cpu::Sgemm before = cpu::swap_library_sgemm(failing);
  uint32_t seed = 950;
  std::string warnings;
  const Case cases[] = {{cpu::kLibraryDxRows, 256, 1024}, {300, 1030, 200}};
  for (const Case& c : cases) {  // M tokens, N = OC, K = IC
    const int64_t M = c.M, OC = c.N, IC = c.K;
    const Operand dout = make(M, OC, Layout::kcontig, false, false, seed++);
    const Operand xT = make(IC, M, Layout::rcontig, false, false, seed++);
    const auto* d = static_cast<const float*>(dout.view.p);
    const auto* x = static_cast<const float*>(xT.view.p);
    const std::vector<double> w0 = test::randn(size_t(OC * IC), seed++);
    std::vector<float> W(w0.begin(), w0.end()), dx(size_t(M * IC), 1e30f);
    set->f32_dx_sgd(M, OC, IC, d, x, W.data(), dx.data(), 0.01f);
    std::vector<float> W2(w0.begin(), w0.end()), dx2(dx.size(), 1e30f);
    testing::internal::CaptureStderr();
    cpu::gemm_f32_dx_sgd(M, OC, IC, d, x, W2.data(), dx2.data(), 0.01f);
    warnings += testing::internal::GetCapturedStderr();
    const std::string what = "M=" + std::to_string(M) + " OC=" + std::to_string(OC);
    EXPECT_EQ(dx2, dx) << what << ": dx on our kernels";
    EXPECT_EQ(W2, W) << what << ": the SGD step on our kernels";
  }
  cpu::swap_library_sgemm(before);
  EXPECT_EQ(failed, 2);
  EXPECT_EQ(std::count(warnings.begin(), warnings.end(), '\n'), 1) << warnings;
  EXPECT_EQ(warnings.rfind("warning: ", 0), 0u) << warnings;
  EXPECT_NE(warnings.find("sgemm failed (status 3); fp32 dx on our kernels"), std::string::npos)
      << warnings;
}

// A thread done with its band takes rows of another band's last block (with that band's
// packed B): more threads than cores (descheduled threads finish late, so others take their
// rows) must give the bits of one thread, on every kind of block. Split by rows (one block;
// several k blocks), by columns, the scaled sums over sub-blocks (with A packed, and with A's
// rows contiguous, which the AVX-512 fp32 kernels read in place), accumulate, rounded, and
// the bf16 SGD step. The fp32 sums of one thread are also checked against plain sums.
TEST(Gemm, RowsTakenFromSlowerBandsGiveTheSameBits) {
  FOR_EACH_SET(set) {
    uint32_t seed = 500;
    const Case cases[] = {{1000, 300, 200}, {1000, 100, 700}, {300, 2000, 100},
                          {1000, 64, 1500}, {200, 1100, 600},  // (columns, sub-blocks)
                          {40, 300, 3000}};  // few rows, many k blocks: split by k blocks
    for (const Case& c : cases)
      for (Layout la : {Layout::kcontig, Layout::rcontig})
        for (int kind = 0; kind < 6; ++kind) {
          const bool bf16 = kind & 1, scaled = kind >= 4, acc = kind & 2 || scaled;
          const auto gemm = bf16 ? set->bf16 : set->f32;
          const Operand A = make(c.M, c.K, la, false, bf16, seed++);
          const Operand B = make(c.N, c.K, Layout::rcontig, false, bf16, seed++);
          const std::vector<double> c0 = test::randn(size_t(c.M * c.N), seed++);
          std::vector<uint16_t> w0(c0.size());
          for (size_t i = 0; i < c0.size(); ++i) w0[i] = f32_to_bf16(float(c0[i]));
          const std::string what = std::string(set->name) + ": M=" + std::to_string(c.M) +
                                   " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                                   " kind " + std::to_string(kind) + " layout " +
                                   std::to_string(int(la));
          std::vector<float> one;
          std::vector<uint16_t> one16;
          for (int threads : {1, 3, 5})
            for (int rep = 0; rep < (threads == 1 ? 1 : 4); ++rep) {
              omp_set_num_threads(threads);
              std::vector<float> C(c0.begin(), c0.end());
              std::vector<uint16_t> W = w0;
              if (scaled && bf16)
                set->bf16_sgd(c.M, c.N, c.K, A.view, B.view, W.data(), c.N, 0.01f);
              else
                gemm(c.M, c.N, c.K, A.view, B.view, C.data(), c.N, acc, scaled ? -0.01f : 1.0f,
                     kind == 3 ? cpu::Store::round : cpu::Store::f32);
              omp_set_num_threads(cpu::threads());
              if (threads == 1) {
                one = C, one16 = W;
                if (bf16) continue;
                const float alpha = scaled ? -0.01f : 1.0f;
                for (int64_t m = 0; m < c.M; m += 7)  // every 7th row: the sums' shapes repeat
                  for (int64_t n = 0; n < c.N; ++n) {
                    const double c00 = acc ? double(float(c0[size_t(m * c.N + n)])) : 0.0;
                    double sum = 0, mag = 0;
                    for (int64_t k = 0; k < c.K; ++k) {
                      const double p = A.val[size_t(m * c.K + k)] * B.val[size_t(n * c.K + k)];
                      sum += p, mag += std::fabs(p);
                    }
                    ASSERT_NEAR(
                        C[size_t(m * c.N + n)], c00 + alpha * sum,
                        double(c.K + 2) * 6e-8 * (std::fabs(alpha) * mag + std::fabs(c00)) + 1e-30)
                        << what << " at (" << m << ", " << n << ")";
                  }
                continue;
              }
              ASSERT_EQ(C, one) << what << ", " << threads << " threads";
              ASSERT_EQ(W, one16) << what << ", " << threads << " threads";
            }
        }
  }
}

// The rounded store (bf16 runs' layer outputs) is the plain product rounded to bf16, bit for
// bit: on the skinny path (bf16 weights), over several k blocks (rounded once, at the last),
// accumulating, and on the empty sum; with few rows over many k blocks (split by k blocks)
// the same bits at 1, 2 and 3 threads.
TEST(Gemm, RoundedStoresAreTheRoundedProducts) {
  FOR_EACH_SET(set) {
    uint32_t seed = 300;
    for (int64_t M : {32, 150})
      for (int64_t K : {0, 7, 256, 600, 2600})
        for (int kind = 0; kind < 8; ++kind) {
          const bool bf16 = kind & 1, acc = kind & 2;
          const auto gemm = bf16 ? set->bf16 : set->f32;
          const int64_t N = 70;
          const Operand A = make(M, K, Layout::kcontig, false, bf16, seed++);
          // B's rows contiguous in k (the skinny path), or contiguous across rows (dx = dout W)
          const Operand B =
              make(N, K, kind & 4 ? Layout::rcontig : Layout::kcontig, bf16, bf16, seed++);
          const std::vector<double> c0 = test::randn(size_t(M * N), seed++);
          std::vector<float> plain(c0.begin(), c0.end()), rounded = plain;
          gemm(M, N, K, A.view, B.view, plain.data(), N, acc, 1.0f, cpu::Store::f32);
          gemm(M, N, K, A.view, B.view, rounded.data(), N, acc, 1.0f, cpu::Store::round);
          for (int threads : {1, 3}) {
            omp_set_num_threads(threads);
            std::vector<float> again(c0.begin(), c0.end());
            gemm(M, N, K, A.view, B.view, again.data(), N, acc, 1.0f, cpu::Store::round);
            omp_set_num_threads(cpu::threads());
            ASSERT_EQ(again, rounded)
                << set->name << ": M=" << M << " K=" << K << ", " << threads << " threads";
          }
          for (size_t i = 0; i < plain.size(); ++i)
            ASSERT_EQ(round_bf16(plain[i]), rounded[i])
                << set->name << ": M=" << M << " K=" << K << " bf16 kind " << bf16 << " acc " << acc
                << " at " << i;
        }
  }
}

// Stored as bf16 bits (bf16 runs' activations in bf16 storage): the rounded product's bits,
// with C's row stride wider than N and nothing outside [M, N) written; on the skinny path,
// one k block (single and row bands over two threads), several (summed in sub-blocks), more
// than one packed block holds (summed aside), the empty sum; A and B from fp32 or bf16 storage
// in the layouts the model gives them.
TEST(Gemm, Bf16StoresAreTheRoundedProducts) {
  FOR_EACH_SET(set) {
    uint32_t seed = 500;
    for (int64_t M : {32, 150, 400})
      for (int64_t K : {0, 7, 256, 1100, 5000})
        for (int kind = 0; kind < 8; ++kind) {
          const bool asrc = kind & 1;  // A in bf16 storage (the MLP's activations)
          const Layout la = kind & 2 ? Layout::rcontig : Layout::kcontig;
          const int64_t N = 70, ldc = N + 5;
          const Operand A = make(M, K, la, asrc, true, seed++);
          // B's rows contiguous in k, or across rows (the weights of dx = dout W)
          const Operand B =
              make(N, K, kind & 4 ? Layout::rcontig : Layout::kcontig, true, true, seed++);
          std::vector<uint16_t> one;
          for (int threads : {1, 3}) {
            omp_set_num_threads(threads);
            std::vector<float> want(size_t(M * N));
            std::vector<uint16_t> got(size_t(M * ldc), 0xdead);
            set->bf16(M, N, K, A.view, B.view, want.data(), N, false, 1.0f, cpu::Store::round);
            set->bf16(M, N, K, A.view, B.view, reinterpret_cast<float*>(got.data()), ldc, false,
                      1.0f, cpu::Store::bf16);
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < ldc; ++n) {
                const uint16_t g = got[size_t(m * ldc + n)];
                ASSERT_EQ(g, n < N ? f32_to_bf16(want[size_t(m * N + n)]) : 0xdead)
                    << set->name << ": M=" << M << " K=" << K << " bf16 A " << asrc << " layout "
                    << int(la) << " kind " << kind << ", " << threads << " threads, at " << m
                    << ", " << n;
              }
            if (threads == 1) one = got;
            ASSERT_EQ(got, one) << set->name << ": M=" << M << " K=" << K << ", 3 threads";
          }
          omp_set_num_threads(cpu::threads());
        }
  }
}

// The fused bf16 SGD step is the model's unfused one (the sum rounded into a bf16 gradient,
// then sgd_update_bf16) bit for bit, with NaNs, infinities, the largest bf16, zeros of both
// signs and subnormals in the operands and the weights (sums that overflow, inf - inf): the
// AVX-512 epilogue rounds without a NaN case (gemm_avx512.cpp). A NaN must stay a NaN; its
// sign and payload are not compared (where two NaNs meet, x86 keeps the first operand's, and
// the compiler may order the operands of a sum either way).
TEST(Gemm, SgdStepKeepsNonFiniteValuesAsTheUnfusedStep) {
  const uint16_t special[] = {0x7fc0, 0xffc0, 0x7fa0, 0x7f80, 0xff80, 0x7f7f,
                              0xff7f, 0x0001, 0x8001, 0x8000, 0x0000};
  FOR_EACH_SET(set) {
    uint32_t seed = 900;
    for (int64_t K : {5, 32, 64})  // (one k block: the same order of sums as set->bf16)
      for (int64_t M : {30, 100}) {
        const int64_t N = 45;
        Operand A = make(M, K, Layout::rcontig, true, true, seed++);
        Operand B = make(N, K, Layout::rcontig, true, true, seed++);
        std::vector<uint16_t> W(size_t(M * N));
        const std::vector<double> w0 = test::randn(W.size(), seed++);
        for (size_t i = 0; i < W.size(); ++i) W[i] = f32_to_bf16(float(w0[i]));
        uint32_t r = seed++;
        const auto next = [&r] { return r = r * 1664525u + 1013904223u, r >> 8; };
        for (auto* v : {&A.h, &B.h})
          for (int i = 0; i < int(v->size()) / 40; ++i)
            (*v)[next() % v->size()] = special[next() % std::size(special)];
        for (int i = 0; i < int(W.size()) / 10; ++i)
          W[next() % W.size()] = special[next() % std::size(special)];
        // the unfused step: the fp32 sums, a bf16 gradient, the update
        std::vector<float> G(W.size());
        set->bf16(M, N, K, A.view, B.view, G.data(), N, false, 1.0f, cpu::Store::f32);
        std::vector<uint16_t> g16(W.size()), want = W, got = W;
        for (size_t i = 0; i < G.size(); ++i) g16[i] = f32_to_bf16(0.0f + G[i]);
        cpu_ops().sgd_update_bf16(want.data(), g16.data(), int64_t(want.size()), 0.3f);
        set->bf16_sgd(M, N, K, A.view, B.view, got.data(), N, 0.3f);
        size_t nonfinite = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          nonfinite += (want[i] & 0x7f80) == 0x7f80;
          const auto nan = [](uint16_t h) { return (h & 0x7fff) > 0x7f80; };
          if (nan(want[i]) && nan(got[i])) continue;
          ASSERT_EQ(got[i], want[i]) << set->name << " M=" << M << " K=" << K << " at " << i / N
                                     << "," << i % N << ": gradient sum " << G[i];
        }
        EXPECT_GT(nonfinite, W.size() / 20) << "the specials reached too few weights";
      }
  }
}

// alpha and the fused SGD step need the whole sum before the store, also when K spans
// several k blocks (partial sums kept per thread): against plain sums, both thread counts.
TEST(Gemm, ScaledAndSgdStoresSumOverEveryKBlock) {
  FOR_EACH_SET(set) {
    uint32_t seed = 100;
    for (int64_t K : {5, 300, 700, 1500, 2500})  // 2500: fp32 past one k block of the SGD
      for (int64_t M : {7, 150, 400}) {          // 400: row bands (two threads)
        const int64_t N = 45;
        const Operand A = make(M, K, Layout::rcontig, false, true, seed++);
        const Operand B = make(N, K, Layout::rcontig, false, true, seed++);
        const std::vector<double> w0 = test::randn(size_t(M * N), seed++);
        std::vector<float> Wf(w0.begin(), w0.end());
        std::vector<uint16_t> Wh(Wf.size());
        for (size_t i = 0; i < Wf.size(); ++i) Wh[i] = f32_to_bf16(Wf[i]);
        const float lr = 0.3f, step = round_bf16(-lr);
        std::vector<float> F[2];
        std::vector<uint16_t> H[2];
        for (int threads : {2, 1}) {
          omp_set_num_threads(threads);
          F[threads - 1] = Wf;
          H[threads - 1] = Wh;
          set->f32(M, N, K, A.view, B.view, F[threads - 1].data(), N, true, -lr, cpu::Store::f32);
          set->bf16_sgd(M, N, K, A.view, B.view, H[threads - 1].data(), N, lr);
        }
        omp_set_num_threads(cpu::threads());
        ASSERT_EQ(F[0], F[1]) << set->name << " K=" << K;
        ASSERT_EQ(H[0], H[1]) << set->name << " K=" << K;
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            double g = 0, mag = 0;
            for (int64_t k = 0; k < K; ++k) {
              const double p = A.val[size_t(m * K + k)] * B.val[size_t(n * K + k)];
              g += p;
              mag += std::fabs(p);
            }
            const size_t i = size_t(m * N + n);
            const double f = double(Wf[i]) - double(lr) * g;
            ASSERT_NEAR(F[1][i], f, double(K + 2) * 6e-8 * (lr * mag + std::fabs(Wf[i])) + 1e-30)
                << set->name << " fp32 K=" << K << " at " << m << "," << n;
            // bf16: each of the three roundings may land one bf16 step away
            const double h =
                round_bf16(bf16_to_f32(Wh[i]) + round_bf16(step * round_bf16(float(g))));
            ASSERT_NEAR(bf16_to_f32(H[1][i]), h,
                        std::ldexp(std::fabs(h) + std::fabs(step * g), -7) + K * 6e-8 * mag * lr)
                << set->name << " bf16 K=" << K << " at " << m << "," << n;
          }
      }
  }
}

// bf16 operands that are not bf16 values are rounded to nearest even, not truncated, on
// every packing path (k-contiguous, row-contiguous, strided) of every kernel set.
TEST(Gemm, Bf16RoundsFp32OperandsToNearest) {
  // ties both ways (1 + 1/256 -> 1, 1 + 3/256 -> 1 + 4/256), either sign, off-tie values
  const std::vector<float> a = {1.0f + 1.0f / 256,
                                1.0f + 3.0f / 256,
                                -(1.0f + 3.0f / 256),
                                1.0f + 2.5f / 256,
                                3.14159265f,
                                1e-3f,
                                -7.77e5f,
                                0.1f,
                                65.4321f};
  const int64_t n = int64_t(a.size());
  std::vector<float> eye(size_t(n * n), 0.0f), one = {1.0f}, pad(size_t(n * 200), 0.0f);
  for (int64_t i = 0; i < n; ++i) eye[size_t(i * n + i)] = 1.0f, pad[size_t(i * 2)] = a[size_t(i)];
  FOR_EACH_SET(set) {
    std::vector<float> c0(a.size()), c1(a.size()), c2(a.size());
    // A as one row of n k's (packed k-contiguous) against the identity: row 0 of C is bf16(a)
    set->bf16(1, n, n, {a.data(), false, n, 1}, {eye.data(), false, n, 1}, c0.data(), n, false,
              1.0f, cpu::Store::f32);
    // A as n rows of one k: row-contiguous, then strided
    set->bf16(n, 1, 1, {a.data(), false, 1, n}, {one.data(), false, 1, 1}, c1.data(), 1, false,
              1.0f, cpu::Store::f32);
    set->bf16(n, 1, 1, {pad.data(), false, 2, 7}, {one.data(), false, 1, 1}, c2.data(), 1, false,
              1.0f, cpu::Store::f32);
    for (int64_t i = 0; i < n; ++i) {
      const float want = round_bf16(a[size_t(i)]);
      EXPECT_EQ(c0[size_t(i)], want) << set->name << " k-contiguous, value " << a[size_t(i)];
      EXPECT_EQ(c1[size_t(i)], want) << set->name << " row-contiguous, value " << a[size_t(i)];
      EXPECT_EQ(c2[size_t(i)], want) << set->name << " strided, value " << a[size_t(i)];
    }
  }
}

}  // namespace
}  // namespace tq
