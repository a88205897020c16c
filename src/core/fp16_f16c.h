// The F16C bulk converters (src/core/fp16_f16c.cpp, the only file built with -mf16c). Private to
// src/kernels/: call them only after __builtin_cpu_supports("f16c") said yes (fp16.cpp does).
#pragma once

#include <cstdint>

namespace coc::detail {
void fp16_to_fp32_f16c(const uint16_t* src, float* dst, int64_t n);
void fp32_to_fp16_f16c(const float* src, uint16_t* dst, int64_t n);
}  // namespace coc::detail
