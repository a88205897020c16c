// fp16 ⇄ fp32: the scalar reference and the run-time dispatch to F16C (fp16.h). The scalar code follows the
// binary16 layout (1 sign, 5 exponent bits, bias 15, 10 mantissa bits) bit by bit, with round to nearest even,
// so it gives the same bits as VCVTPS2PH with imm8 = 0.
#include "coc/core/fp16.h"

#include <cstring>

#include "fp16_f16c.h"

namespace coc {

bool fp16_uses_f16c() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("f16c");
  return has;
#else
  return false;
#endif
}

float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf / NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);  // 112 = 127 − 15
  } else if (man == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise the mantissa into an fp32 normal.
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while ((man & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t float_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u)  // inf or NaN (NaN stays quiet)
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? (0x200u | ((absx >> 13) & 0x3ffu)) : 0));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  const int32_t exp = static_cast<int32_t>(absx >> 23) - 127;
  if (exp >= -14) {
    // Normal half: keep 10 mantissa bits, round the 13 dropped ones to nearest even (a carry may bump the exponent,
    // which is exactly right).
    uint32_t m = absx & 0x7fffffu;
    uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | (m >> 13);
    const uint32_t rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (exp < -25) return sign;  // below half the smallest subnormal: ±0
  // Subnormal half: value = m · 2^-24 with the implicit bit made explicit.
  const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
  const int shift = -exp - 1;  // 14..24 → the 24-bit mantissa shifted to units of 2^-24
  uint32_t h = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

void fp16_to_fp32(const uint16_t* src, float* dst, int64_t n) {
  if (n <= 0) return;
  if (fp16_uses_f16c()) return detail::fp16_to_fp32_f16c(src, dst, n);
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_float(src[i]);
}

void fp32_to_fp16(const float* src, uint16_t* dst, int64_t n) {
  if (n <= 0) return;
  if (fp16_uses_f16c()) return detail::fp32_to_fp16_f16c(src, dst, n);
  for (int64_t i = 0; i < n; ++i) dst[i] = float_to_fp16(src[i]);
}

}  // namespace coc
