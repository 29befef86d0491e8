// bf16 rounding and storage of 16 fp32 lanes, for the code built for AVX-512 (F, BW, VL): the
// products (gemm_avx512.cpp) and attention's QK-norm rows (layers.cpp). Each file gets its own
// copy (an anonymous namespace): see gemm_driver.h on inline functions shared between files
// built for different instructions.
#pragma once
// GCC 12's AVX-512 headers trip -Wuninitialized on their own _mm512_undefined_* (GCC PR 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#include <cstdint>

namespace tq::cpu::bf16x16 {
namespace {

inline __m512i rne_biased(__m512i u) {  // u + 0x7fff + bit 16 of u: high half bf16(u), RNE
  const __m512i t = _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff));
  return _mm512_mask_add_epi32(t, _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x10000)), t,
                               _mm512_set1_epi32(1));
}
// x rounded to the nearest bf16 (ties even; NaN stays NaN), as f32_to_bf16 in core/common.h
inline __m512 round_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i r = _mm512_mask_or_epi32(rne_biased(u), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), u,
                                         _mm512_set1_epi32(0x400000));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(int(0xffff0000u))));
}
inline __m512 load_bf16(const uint16_t* p, __mmask16 m) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
inline void store_bf16(uint16_t* p, __mmask16 m, __m512 x) {  // x already a bf16 value
  _mm256_mask_storeu_epi16(p, m,
                           _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16)));
}

}  // namespace
}  // namespace tq::cpu::bf16x16
