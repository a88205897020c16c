// DType names (coc/core/dtype.h).
#include "coc/core/dtype.h"

#include "coc/core/error.h"

namespace coc {

const char* to_string(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
    case DType::kInt8: return "int8";
  }
  return "?";
}

DType parse_dtype(const std::string& s, const std::string& flag) {
  if (s == "fp32" || s == "float32" || s == "f32") return DType::kF32;
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  if (s == "fp16" || s == "float16" || s == "f16") return DType::kF16;
  throw_invalid("{} '{}' is not an element type; use fp32, bf16 or fp16", flag, s);
}

}  // namespace coc
