// IEEE 754 binary16 ("fp16": the 16-bit activations of w8a16, --fp16's messages) ⇄ fp32 conversion.
//
// fp16 is a storage and transfer format in coc (coc/core/dtype.h); every sum is taken in fp32. The
// bulk converters use the F16C instructions (VCVTPH2PS / VCVTPS2PH, Intel SDM vol. 2) when the CPU has them,
// checked once at run time with __builtin_cpu_supports("f16c"), and a portable scalar routine otherwise. Only
// src/core/fp16_f16c.cpp is compiled with -mf16c, so the binary still runs on CPUs without F16C. Both paths
// round to nearest, ties to even, and handle subnormals, infinities and NaN, so they give identical bits.
#pragma once

#include <cstdint>

namespace coc {

/// True when the bulk converters below use F16C (decided once per process).
bool fp16_uses_f16c();

/// One value; scalar reference (round to nearest even on the way down).
float fp16_to_float(uint16_t h);
uint16_t float_to_fp16(float f);

/// dst[i] = src[i] for i < n (n elements, not bytes). src and dst must not overlap. n may be 0.
void fp16_to_fp32(const uint16_t* src, float* dst, int64_t n);
void fp32_to_fp16(const float* src, uint16_t* dst, int64_t n);

}  // namespace coc
