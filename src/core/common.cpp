#include "core/common.h"

namespace tq {

DType parse_dtype(const std::string& s) {
  if (s == "float32" || s == "fp32") return DType::f32;
  if (s == "bfloat16" || s == "bf16") return DType::bf16;
  throw Error("unknown dtype '" + s + "' (use float32 or bfloat16)");
}
const char* dtype_name(DType t) {
  return t == DType::f32 ? "float32" : "bfloat16";
}

std::string with_commas(int64_t v) {
  const std::string d = std::to_string(v);
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i && d[i - 1] != '-' && (d.size() - i) % 3 == 0) s += ',';
    s += d[i];
  }
  return s;
}

}  // namespace tq
