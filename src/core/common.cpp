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

}  // namespace tq
