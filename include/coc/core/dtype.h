// Element types of tensors, GEMM operands and messages: fp32, and the two 16-bit formats of mixed precision.
//
// bf16 ("brain float", the upper 16 bits of an IEEE binary32: 1 sign, 8 exponent, 7 mantissa bits) has fp32's
// range and 8 bits of precision; unit roundoff u = 2^-8 under round-to-nearest-even. fp16 (IEEE binary16: 5
// exponent, 10 mantissa bits) has u = 2^-11 and a range up to 65504. Both are storage and transfer formats in
// coc: every sum of 16-bit values is taken in fp32 and rounded once (GEMMs accumulate in fp32 inside oneDNN, the
// collectives convert, add and round: docs/semantics.md §9). The structs are distinct types so that a bf16 buffer
// can never be passed where fp16 bits are expected; their bits are the IEEE/bf16 encodings, nothing else.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace coc {

/// The 16 bits of a bfloat16 value.
struct BFloat16 {
  uint16_t bits = 0;
};
/// The 16 bits of an IEEE 754 binary16 value.
struct Float16 {
  uint16_t bits = 0;
};
static_assert(sizeof(BFloat16) == 2 && sizeof(Float16) == 2);

/// kInt8 is only the weights of w8a16 (coc/kernels/quant.h); the others are activations, gradients and messages.
enum class DType : uint8_t { kF32, kBF16, kF16, kInt8 };

/// Bytes per element: 4, 2 or 1.
constexpr int64_t dtype_size(DType t) { return t == DType::kF32 ? 4 : t == DType::kInt8 ? 1 : 2; }
/// "fp32", "bf16", "fp16", "int8": the names of the --dtype flags (and of Megatron's --bf16 / --fp16).
const char* to_string(DType t);
/// Inverse of to_string for the floating-point types (also "float32", "bfloat16", "float16"); throws
/// kInvalidArgument naming `flag`, the value and the accepted names for anything else, int8 included.
DType parse_dtype(const std::string& s, const std::string& flag);

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::kF32; }
template <>
constexpr DType dtype_of<BFloat16>() { return DType::kBF16; }
template <>
constexpr DType dtype_of<Float16>() { return DType::kF16; }

/// bf16 → fp32: exact (the bits move up).
inline float bf16_to_float(BFloat16 h) {
  const uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// fp32 → bf16, round to nearest, ties to even (as VCVTNEPS2BF16 and PyTorch round); NaN stays a quiet NaN of the
/// same sign, ±inf and ±0 stay themselves, a finite value beyond bf16's largest rounds to ±inf as IEEE says, and
/// subnormals round like any other value (VCVTNEPS2BF16 flushes them to zero; coc never uses it, so its bits are
/// the same on every CPU).
inline BFloat16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x0040u)};  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>(u >> 16)};
}

}  // namespace coc
