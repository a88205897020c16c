// bf16 ⇄ fp32 bulk conversion (coc/core/bf16.h).
#include "coc/core/bf16.h"

#include <immintrin.h>

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

namespace {
__attribute__((target_clones("avx512f", "avx2", "default"))) void fp32_to_bf16_rule(const float* src, BFloat16* dst,
                                                                                     int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(src[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x0040u;
    dst[i].bits = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void round_to_bf16_rule(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(x[i]);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const uint32_t quiet_nan = u | 0x00400000u;
    x[i] = std::bit_cast<float>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan & 0xffff0000u : rounded);
  }
}

// AVX512_BF16's VCVTNEPS2BF16 rounds to nearest even and quiets NaNs as the rule above does, but flushes subnormal
// inputs to zero: a block of 16 holding a subnormal takes the rule instead, so every CPU gives the same bits
// (tests/core/test_dtype.cpp feeds random bit patterns). Measured on a Zen 5 core: ~1.8x the rule's speed.
#define COC_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
COC_BF16_TARGET __mmask16 subnormal_lanes(__m512 x) {
  const __m512i a = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
  return _mm512_cmplt_epi32_mask(a, _mm512_set1_epi32(0x00800000)) &
         _mm512_cmpneq_epi32_mask(a, _mm512_setzero_si512());
}

// Full blocks through plain loads and stores, the tail through masked ones (the masked-off lanes load as zeros,
// which are not subnormal). Why not masked throughout: on a Zen 5 core a masked load whose mask is computed in the
// loop ran this pass at 0.54 ns per element from memory against 0.20 plain (docs/performance.md point 54); the
// attention heads' rows are 32-128 elements long, converted one row at a time, so the tail's cost stays per row.
COC_BF16_TARGET void fp32_to_bf16_avx512bf16(const float* src, BFloat16* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(src + i);
    if (subnormal_lanes(x)) {
      fp32_to_bf16_rule(src + i, dst + i, 16);
      continue;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
  }
  if (i == n) return;
  const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
  const __m512 x = _mm512_maskz_loadu_ps(m, src + i);
  if (subnormal_lanes(x)) return fp32_to_bf16_rule(src + i, dst + i, n - i);
  _mm256_mask_storeu_epi16(dst + i, m, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
}

COC_BF16_TARGET void fp32_to_bf16_rows_avx512bf16(const float* src, int64_t src_ld, BFloat16* dst, int64_t dst_ld,
                                                  int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) fp32_to_bf16_avx512bf16(src + r * src_ld, dst + r * dst_ld, cols);
}

COC_BF16_TARGET void round_to_bf16_avx512bf16(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    if (subnormal_lanes(v)) {
      round_to_bf16_rule(x + i, 16);
      continue;
    }
    // The maskz forms: GCC 12 warns about the undefined source of the plain ones (-Wmaybe-uninitialized).
    const __m512i h = _mm512_maskz_cvtepu16_epi32(0xffff, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
    _mm512_storeu_si512(x + i, _mm512_maskz_slli_epi32(0xffff, h, 16));
  }
  round_to_bf16_rule(x + i, n - i);
}
#undef COC_BF16_TARGET

// A namespace-scope initializer may run before libgcc's own CPU detection: initialise it first.
const bool g_avx512bf16 = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") != 0;
}();
}  // namespace

void fp32_to_bf16(const float* src, BFloat16* dst, int64_t n) {
  if (g_avx512bf16) return fp32_to_bf16_avx512bf16(src, dst, n);
  fp32_to_bf16_rule(src, dst, n);
}

void fp32_to_bf16_rows(const float* src, int64_t src_ld, BFloat16* dst, int64_t dst_ld, int64_t rows,
                       int64_t cols) {
  COC_ASSERT(rows >= 0 && cols >= 0 && (rows <= 1 || (src_ld >= cols && dst_ld >= cols)),
             "fp32_to_bf16_rows: [{}, {}] with ld {} -> ld {}", rows, cols, src_ld, dst_ld);
  if (src_ld == cols && dst_ld == cols) return fp32_to_bf16(src, dst, rows * cols);
  if (g_avx512bf16) return fp32_to_bf16_rows_avx512bf16(src, src_ld, dst, dst_ld, rows, cols);
  for (int64_t r = 0; r < rows; ++r) fp32_to_bf16_rule(src + r * src_ld, dst + r * dst_ld, cols);
}

void round_to_bf16(float* x, int64_t n) {
  if (g_avx512bf16) return round_to_bf16_avx512bf16(x, n);
  round_to_bf16_rule(x, n);
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
