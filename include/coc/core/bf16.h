// Bulk bf16 ⇄ fp32 conversion (the element format: coc/core/dtype.h; fp16: coc/core/fp16.h).
//
// Both directions are the scalar rules of dtype.h applied element by element, compiled for AVX-512, AVX2 and plain
// x86-64 (GCC's target_clones, picked once at load time): the bits are the same on every CPU, which keeps
// --deterministic runs comparable between machines. Round to nearest even on the way down.
#pragma once

#include <cstdint>

#include "coc/core/dtype.h"

namespace coc {

/// dst[i] = src[i] for i < n (elements, not bytes). src and dst must not overlap. n may be 0.
void bf16_to_fp32(const BFloat16* src, float* dst, int64_t n);
void fp32_to_bf16(const float* src, BFloat16* dst, int64_t n);
/// dst[r·dst_ld + c] = src[r·src_ld + c] for r < rows, c < cols: a strided matrix in one call, so that short rows (an
/// attention head's 32-128 columns) do not pay a dispatch each. ld >= cols where rows > 1 (kInternal otherwise); no
/// overlap.
void fp32_to_bf16_rows(const float* src, int64_t src_ld, BFloat16* dst, int64_t dst_ld, int64_t rows, int64_t cols);
/// x[i] = bf16_to_float(float_to_bf16(x[i])) in place: the value a bf16 tensor would hold, kept in an fp32 buffer
/// (how --bf16 stores its activations, docs/mixed-precision.md). n may be 0.
void round_to_bf16(float* x, int64_t n);

/// 16-bit (bf16 or fp16, by `t`) ⇄ fp32, for code that holds 16-bit buffers of either format (the collectives'
/// sums, the 16-bit GEMM operands). `t` must not be kF32 (kInternal otherwise).
void half_to_fp32(DType t, const void* src, float* dst, int64_t n);
void fp32_to_half(DType t, const float* src, void* dst, int64_t n);
/// x[i] = the value of x[i] rounded to `t` (bf16 or fp16; round_to_bf16 for bf16), kept in fp32, in place. fp16
/// overflows to ±inf beyond 65504, as an fp16 tensor does (what --fp16's loss scaling watches for).
void round_to_half(DType t, float* x, int64_t n);

}  // namespace coc
