// The element formats (coc/core/dtype.h, coc/core/bf16.h): bf16 rounding to nearest even, the special values, the
// bulk converters against the scalar rules on every bf16 value and a sweep of fp32 bit patterns, and the names.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "coc/core/bf16.h"
#include "coc/core/dtype.h"
#include "coc/core/error.h"

namespace coc {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Bf16, RoundsToNearestEven) {
  // bf16 keeps 7 mantissa bits: the spacing above 1 is 2^-7.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f)), 1.0f) << "a tie rounds to the even neighbour (1)";
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f) << "a tie rounds to even (up)";
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f) << "above the tie: up";
  EXPECT_EQ(bf16_to_float(float_to_bf16(-1.0f - 0x1p-9f)), -1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(3.140625f)), 3.140625f) << "exact values stay";
}

TEST(Bf16, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bf16_to_float(float_to_bf16(inf)), inf);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-inf)), -inf);
  EXPECT_TRUE(std::signbit(bf16_to_float(float_to_bf16(-0.0f))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(std::numeric_limits<float>::max())), inf) << "beyond bf16's largest: inf";
  const BFloat16 nan = float_to_bf16(from_bits(0x7f800001u));  // a signalling NaN whose payload sits in low bits
  EXPECT_TRUE(std::isnan(bf16_to_float(nan))) << "a NaN must not round to inf";
  EXPECT_TRUE(std::signbit(bf16_to_float(float_to_bf16(-std::numeric_limits<float>::quiet_NaN()))));
  const float sub = from_bits(0x00012345u);  // an fp32 subnormal: rounded, not flushed
  EXPECT_EQ(float_to_bf16(sub).bits, 0x0001u);
}

TEST(Bf16, EveryBf16ValueSurvivesTheRoundTrip) {
  std::vector<BFloat16> all(65536), back(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i].bits = static_cast<uint16_t>(i);
  std::vector<float> f(65536);
  bf16_to_fp32(all.data(), f.data(), 65536);
  fp32_to_bf16(f.data(), back.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    const bool nan = (i & 0x7fffu) > 0x7f80u;
    if (nan)
      EXPECT_TRUE(std::isnan(f[i])) << i;
    else
      ASSERT_EQ(back[i].bits, i) << "bf16 bits " << i;
  }
}

TEST(Bf16, BulkConvertersMatchTheScalarRule) {
  std::mt19937 g(7);
  std::vector<float> src(4099);  // not a multiple of any vector width
  for (auto& x : src) x = from_bits(static_cast<uint32_t>(g()));
  std::vector<BFloat16> dst(src.size());
  fp32_to_bf16(src.data(), dst.data(), static_cast<int64_t>(src.size()));
  for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(dst[i].bits, float_to_bf16(src[i]).bits) << i;
  fp32_to_bf16(src.data(), dst.data(), 0);  // n = 0 touches nothing
}

// Strided rows of every length up to 40 (the masked tails of the AVX512_BF16 path), subnormals (in a full block and
// in a tail) and NaNs among them, and the contiguous case, which converts as one run.
TEST(Bf16, StridedRowsMatchTheScalarRule) {
  std::mt19937 g(13);
  for (int64_t cols = 0; cols <= 40; ++cols) {
    const int64_t rows = 5, src_ld = cols + 3, dst_ld = cols + 1;
    std::vector<float> src(static_cast<size_t>(rows * src_ld));
    for (auto& x : src) x = from_bits(static_cast<uint32_t>(g()));
    if (cols > 2) src[2] = from_bits(0x00000001u);  // a subnormal: the block takes the scalar rule
    if (cols > 0) src[static_cast<size_t>(src_ld + cols - 1)] = from_bits(0x80000003u);  // one in a tail
    std::vector<BFloat16> dst(static_cast<size_t>(rows * dst_ld), BFloat16{0x5555});
    fp32_to_bf16_rows(src.data(), src_ld, dst.data(), dst_ld, rows, cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < dst_ld; ++c) {
        const uint16_t want = c < cols ? float_to_bf16(src[static_cast<size_t>(r * src_ld + c)]).bits : 0x5555;
        ASSERT_EQ(dst[static_cast<size_t>(r * dst_ld + c)].bits, want) << cols << " cols, row " << r << ", col " << c;
      }
  }
  std::vector<float> src(64, 1.5f);
  std::vector<BFloat16> dst(64);
  fp32_to_bf16_rows(src.data(), 16, dst.data(), 16, 4, 16);
  for (const BFloat16& h : dst) ASSERT_EQ(h.bits, float_to_bf16(1.5f).bits);
  EXPECT_THROW(fp32_to_bf16_rows(src.data(), 8, dst.data(), 16, 2, 16), Error);
}

TEST(Bf16, RoundingInPlaceIsTheRoundTrip) {
  std::mt19937 g(11);
  std::vector<float> x(4099);
  for (auto& v : x) v = from_bits(static_cast<uint32_t>(g()));
  x[0] = from_bits(0x00000001u);     // the smallest subnormal: rounds (to 0), not flushed by a DAZ unit
  x[1] = from_bits(0x00018000u);     // a subnormal tie
  x[2] = from_bits(0x7f800001u);     // a signalling NaN: stays a NaN
  x[3] = std::numeric_limits<float>::max();
  std::vector<float> y = x;
  round_to_bf16(y.data(), static_cast<int64_t>(y.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = bf16_to_float(float_to_bf16(x[i]));
    if (std::isnan(want))
      ASSERT_TRUE(std::isnan(y[i])) << i;
    else
      ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(want)) << i;
  }
}

TEST(Bf16, HalfDispatchPicksTheFormat) {
  const float x[2] = {1.5f, -2.25f};
  uint16_t h[2];
  float back[2];
  fp32_to_half(DType::kF16, x, h, 2);
  EXPECT_EQ(h[0], 0x3e00u);
  half_to_fp32(DType::kF16, h, back, 2);
  EXPECT_EQ(back[1], -2.25f);
  fp32_to_half(DType::kBF16, x, h, 2);
  EXPECT_EQ(h[0], 0x3fc0u);
  EXPECT_THROW(fp32_to_half(DType::kF32, x, h, 2), Error);
}

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(dtype_size(DType::kF32), 4);
  EXPECT_EQ(dtype_size(DType::kBF16), 2);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) EXPECT_EQ(parse_dtype(to_string(t), "--dtype"), t);
  EXPECT_EQ(parse_dtype("bfloat16", "--dtype"), DType::kBF16);
  try {
    parse_dtype("int8", "--dtype");
    FAIL() << "int8 is no floating-point element type";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("--dtype 'int8'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace coc
