// F16C conversion, 8 values per instruction (VCVTPH2PS / VCVTPS2PH with round-to-nearest-even). Built with
// -mf16c (CMakeLists.txt sets it on this file only); fp16.cpp calls in here only when the CPU has F16C. The tail
// (n mod 8) goes through a zero-padded 8-wide buffer, so every value sees the same instruction.
#include <immintrin.h>

#include <cstring>

#include "fp16_f16c.h"

namespace coc::detail {

void fp16_to_fp32_f16c(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  if (i < n) {
    alignas(32) uint16_t in[8] = {};
    alignas(32) float out[8];
    std::memcpy(in, src + i, static_cast<size_t>(n - i) * sizeof(uint16_t));
    _mm256_store_ps(out, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(in))));
    std::memcpy(dst + i, out, static_cast<size_t>(n - i) * sizeof(float));
  }
}

void fp32_to_fp16_f16c(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  if (i < n) {
    alignas(32) float in[8] = {};
    alignas(32) uint16_t out[8];
    std::memcpy(in, src + i, static_cast<size_t>(n - i) * sizeof(float));
    _mm_store_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtps_ph(_mm256_load_ps(in), _MM_FROUND_TO_NEAREST_INT));
    std::memcpy(dst + i, out, static_cast<size_t>(n - i) * sizeof(uint16_t));
  }
}

}  // namespace coc::detail
