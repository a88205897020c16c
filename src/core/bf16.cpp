// bf16 ⇄ fp32 bulk conversion (coc/core/bf16.h).
#include "coc/core/bf16.h"

#include <algorithm>
#include <bit>

#include "coc/core/error.h"
#include "coc/core/fp16.h"

namespace coc {

// The loops are the scalar rules of dtype.h written without branches, so that GCC vectorises them in each clone
// (the file is built with -O3: CMakeLists.txt). Measured on a Zen 5 core, 1 M elements: 650-700 µs down and 290 µs
// up through the scalar functions at -O2, against the ~60 µs of the F16C fp16 converters.
__attribute__((target_clones("avx512f", "avx2", "default"))) void bf16_to_fp32(const BFloat16* src, float* dst,
                                                                                int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(static_cast<uint32_t>(src[i].bits) << 16);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void fp32_to_bf16(const float* src, BFloat16* dst,
                                                                                int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(src[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x0040u;
    dst[i].bits = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void round_to_bf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(x[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const uint32_t quiet_nan = u | 0x00400000u;
    x[i] = std::bit_cast<float>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan & 0xffff0000u : rounded);
  }
}

void half_to_fp32(DType t, const void* src, float* dst, int64_t n) {
  COC_ASSERT(t != DType::kF32, "half_to_fp32 of an fp32 buffer");
  if (t == DType::kBF16) return bf16_to_fp32(static_cast<const BFloat16*>(src), dst, n);
  fp16_to_fp32(static_cast<const uint16_t*>(src), dst, n);
}

void round_to_half(DType t, float* x, int64_t n) {
  COC_ASSERT(t != DType::kF32, "round_to_half to fp32");
  if (t == DType::kBF16) return round_to_bf16(x, n);
  constexpr int64_t kBlock = 1024;  // through a stack buffer: the F16C converters are the fast path
  uint16_t h[kBlock];
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t c = std::min(kBlock, n - i);
    fp32_to_fp16(x + i, h, c);
    fp16_to_fp32(h, x + i, c);
  }
}

void fp32_to_half(DType t, const float* src, void* dst, int64_t n) {
  COC_ASSERT(t != DType::kF32, "fp32_to_half into an fp32 buffer");
  if (t == DType::kBF16) return fp32_to_bf16(src, static_cast<BFloat16*>(dst), n);
  fp32_to_fp16(src, static_cast<uint16_t*>(dst), n);
}

}  // namespace coc
