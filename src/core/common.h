// Shared basics: the error type every bad input becomes, and bf16 conversion.
#pragma once
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tq {

// Bad input (flags, files, shapes). The CLI prints what() as one line and exits 2.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// bf16 is the top half of an fp32; rounding is to nearest even, NaN stays NaN (quiet).
// Branch-free, so that `omp simd` loops that call it vectorize.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u & 0x7fffffffu) > 0x7f800000u ? u | 0x400000u : u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float half_to_f32(uint16_t h) {  // IEEE binary16
  const uint32_t sign = uint32_t(h >> 15) << 31, ex = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t u;
  if (ex == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (ex) {
    u = sign | ((ex + 112) << 23) | (man << 13);
  } else {  // zero or subnormal: man * 2^-24, exact in fp32
    float f = float(man) * 0x1p-24f;
    std::memcpy(&u, &f, 4);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float round_bf16(float f) {
  return bf16_to_f32(f32_to_bf16(f));
}

// 31987968 -> "31,987,968"
std::string with_commas(int64_t v);

enum class DType { f32, bf16 };
DType parse_dtype(const std::string& s);  // "float32" | "bfloat16", else Error
const char* dtype_name(DType t);
inline size_t dtype_size(DType t) {
  return t == DType::f32 ? 4 : 2;
}  // bytes per element

}  // namespace tq
