// Vectorisable fp32 helpers for the softmax and SwiGLU loops (built with -O3 -fno-trapping-math -ffp-contract=off,
// CMakeLists.txt). Their results do not depend on the vector width: max is exact in any order, sums use a fixed
// lane order, and no multiply-add is fused (GCC fuses by default wherever the target has FMA). Static: each file
// that includes this (kernels, tests) keeps its own copy, built with its own flags.
//
// fast_exp: softmax and SwiGLU spend most of their time in exp, and the scalar libm call cannot be vectorised without
// -ffast-math (glibc declares its SIMD expf only under __FAST_MATH__). Cephes' expf (S. L. Moshier,
// cephes/single/expf.c): x = n·ln2 + r with |r| <= ln2/2 (ln2 split in two constants, Cody-Waite), a degree-7
// polynomial for e^r, then 2^n built in the exponent bits. Relative error <= 2 ulp over the clamped range; no
// branch, no table, no errno.
//
// A hazard, measured: GCC 12 may evaluate what follows fast_exp once per arm of its clamps, with the clamped
// constant folded in, for every element. Where that arithmetic turns the saturated value into subnormals, every
// element pays a microcode assist: SwiGLU's g·u/(1 + e^(−g)) divides by 1.65e38 on the g < −88 arm, and its
// vectorised forward ran 7x slower than the scalar libm loop on ordinary gates. So fast_exp's result should only be
// stored or summed in its loop (the softmax), with any further arithmetic in a loop of its own (SwiGLU).
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

// COC_VEC_CLONES: compile the marked loop for AVX-512, AVX2 and plain x86-64, picked at load time (GCC's
// target_clones). These files build with -ffp-contract=off and every reduction here keeps 16 fixed lanes, so each
// clone computes the same operations in the same order: the bits do not depend on the CPU. Measured with perf on a
// Zen 5 core: SwiGLU's sigmoid and the softmax took 8% of a bf16 step in their SSE2 form.
#define COC_VEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace coc::detail {

/// e^x for x in fp32. Below −87.33 (where e^x leaves the normal range) the result is 0, as with flush-to-zero: a
/// subnormal would cost a microcode assist in every later product. Above 88 it saturates at ~1.65e38 instead of
/// going up to 3.4e38 or inf. NaN in gives NaN out, as std::exp.
static inline float fast_exp(float x) {
  constexpr float kMax = 88.0f, kMin = -87.33654f, kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  const float in = x;
  x = x < kMin ? kMin : x;  // NaN passes both clamps and propagates through r and p
  x = x > kMax ? kMax : x;
  // Round x·log2e to the nearest integer without a libm call (floor and rint are calls below SSE4.1): adding
  // 1.5·2^23 leaves no fraction bits, and n is then the low bits of that sum (no float-to-int conversion, which
  // would be undefined for NaN). Needs IEEE evaluation (no -ffast-math, which would fold it).
  constexpr float kRound = 12582912.0f;
  constexpr int32_t kRoundBits = 0x4B400000;  // the bits of 1.5·2^23
  const float t = x * kLog2e + kRound;
  const float fn = t - kRound;
  int32_t tbits;
  std::memcpy(&tbits, &t, sizeof tbits);
  const int32_t n = tbits - kRoundBits;
  const float r = (x - fn * kLn2Hi) - fn * kLn2Lo;
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r2 + r + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(n + 127) << 23;  // 2^n; n in [-126, 127] after the clamp
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return in < kMin ? 0.0f : p * scale;
}

/// max(x[0..n)), n >= 1. GCC will not vectorise a max reduction without -ffinite-math-only (NaN and -0.0 make
/// `a > b ? a : b` order-dependent), so this uses SSE's maxps where there is SSE. Softmax rows have no NaN.
static inline float row_max(const float* x, int64_t n) {
  float r = x[0];
  int64_t c = 0;
#if defined(__SSE__)
  if (n >= 16) {
    // Four independent accumulators hide maxps's latency.
    __m128 m0 = _mm_loadu_ps(x), m1 = _mm_loadu_ps(x + 4), m2 = _mm_loadu_ps(x + 8), m3 = _mm_loadu_ps(x + 12);
    for (c = 16; c + 16 <= n; c += 16) {
      m0 = _mm_max_ps(m0, _mm_loadu_ps(x + c));
      m1 = _mm_max_ps(m1, _mm_loadu_ps(x + c + 4));
      m2 = _mm_max_ps(m2, _mm_loadu_ps(x + c + 8));
      m3 = _mm_max_ps(m3, _mm_loadu_ps(x + c + 12));
    }
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, _mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3)));
    for (float l : lanes) r = l > r ? l : r;
  }
#endif
  for (; c < n; ++c) r = x[c] > r ? x[c] : r;
  return r;
}

/// x[c] = e^(x[c] − shift) for c in [0, n); returns their sum. The sum runs in kExpSumLanes interleaved partial sums
/// (lane l takes c ≡ l mod kExpSumLanes over the full groups, the tail goes in sequentially, then the lanes in
/// order), which the compiler can vectorise while the bits stay those of this fixed order on every CPU.
static inline float exp_shift_sum(float* x, int64_t n, float shift) {
  constexpr int kExpSumLanes = 16;
  float lane[kExpSumLanes] = {};
  int64_t c = 0;
  for (; c + kExpSumLanes <= n; c += kExpSumLanes)
    for (int l = 0; l < kExpSumLanes; ++l) {
      const float e = fast_exp(x[c + l] - shift);
      x[c + l] = e;
      lane[l] += e;
    }
  float sum = 0.0f;
  for (; c < n; ++c) {
    const float e = fast_exp(x[c] - shift);
    x[c] = e;
    sum += e;
  }
  for (float l : lane) sum += l;
  return sum;
}

/// Σ a[c]·b[c] over [0, n), in the same fixed lane order as exp_shift_sum (vectorised, CPU-independent bits).
static inline float row_dot(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 16;
  float lane[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += a[c + l] * b[c + l];
  float sum = 0.0f;
  for (; c < n; ++c) sum += a[c] * b[c];
  for (float l : lane) sum += l;
  return sum;
}

/// Σ a[c]·b[c]·w[c] over [0, n) in fp64 (w may be null: then Σ a·b), in 8 fixed lanes summed in lane order:
/// vectorised (8 doubles per AVX-512 register; a serial fp64 sum waits 4 cycles per element), the same bits on every
/// CPU. RMSNorm's statistics: fp64 because one sum over H ~ 8k feeds every output of the row.
static inline double row_dot_f64(const float* a, const float* b, const float* w, int64_t n) {
  constexpr int kLanes = 8;
  double lane[kLanes] = {};
  int64_t c = 0;
  if (w) {
    for (; c + kLanes <= n; c += kLanes)
      for (int l = 0; l < kLanes; ++l) lane[l] += static_cast<double>(a[c + l]) * b[c + l] * w[c + l];
  } else {
    for (; c + kLanes <= n; c += kLanes)
      for (int l = 0; l < kLanes; ++l) lane[l] += static_cast<double>(a[c + l]) * b[c + l];
  }
  for (int l = 0; c < n; ++c, ++l) lane[l] += static_cast<double>(a[c]) * b[c] * (w ? w[c] : 1.0f);
  double sum = 0.0;
  for (double l : lane) sum += l;
  return sum;
}

}  // namespace coc::detail
