// The vectorisable fp32 helpers behind softmax and SwiGLU (src/kernels/vec_math.h), built with the kernels' flags
// (tests/CMakeLists.txt): fast_exp against fp64 exp over the whole clamped range and at its ends; row_max,
// exp_shift_sum and row_dot for every length around their 16-element groups (the SSE and lane loops plus the
// scalar tail), with the maximum in every position.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "../../src/kernels/vec_math.h"

namespace coc::detail {
namespace {

TEST(FastExp, WithinTwoUlpOverTheRange) {
  double worst = 0.0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / 200000.0f;
    const double ref = std::exp(static_cast<double>(x));
    const double ulp = std::ldexp(1.0, std::ilogb(ref) - 23);
    worst = std::max(worst, std::abs(fast_exp(x) - ref) / ulp);
  }
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(fast_exp(0.0f), 1.0f);
}

TEST(FastExp, FlushesBelowTheNormalRangeAndSaturatesAbove) {
  // Below −87.33 the result is 0, never a subnormal (each would cost an assist in later products).
  for (float x : {-1e30f, -1000.0f, -103.0f, -88.0f, -std::numeric_limits<float>::infinity()})
    EXPECT_EQ(fast_exp(x), 0.0f) << x;
  EXPECT_TRUE(std::isnormal(fast_exp(-87.3f)));
  for (float x : {89.0f, 1000.0f, 1e30f, std::numeric_limits<float>::infinity()}) {
    const float e = fast_exp(x);
    EXPECT_TRUE(std::isfinite(e)) << x;
    EXPECT_NEAR(e / std::exp(88.0), 1.0, 1e-6) << x;
  }
  EXPECT_NEAR(fast_exp(88.0f) / std::exp(88.0), 1.0, 1e-6);
  EXPECT_TRUE(std::isnan(fast_exp(std::numeric_limits<float>::quiet_NaN())));
}

TEST(VecMath, RowHelpersForEveryLengthAndMaxPosition) {
  for (int64_t n = 1; n <= 53; ++n) {
    for (int64_t at = 0; at < n; ++at) {
      std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
      for (int64_t c = 0; c < n; ++c) {
        x[static_cast<size_t>(c)] = -3.0f - 0.25f * static_cast<float>((c * 7) % 11);
        y[static_cast<size_t>(c)] = 0.5f + 0.125f * static_cast<float>(c % 5);
      }
      x[static_cast<size_t>(at)] = 2.5f;
      ASSERT_EQ(row_max(x.data(), n), 2.5f) << "n " << n << " max at " << at;

      double dot = 0.0, sum = 0.0;
      for (int64_t c = 0; c < n; ++c) dot += static_cast<double>(x[static_cast<size_t>(c)]) * y[static_cast<size_t>(c)];
      EXPECT_NEAR(row_dot(x.data(), y.data(), n), dot, 1e-5 * (1.0 + std::abs(dot))) << "n " << n;

      std::vector<double> e(static_cast<size_t>(n));
      for (int64_t c = 0; c < n; ++c) sum += e[static_cast<size_t>(c)] = std::exp(x[static_cast<size_t>(c)] - 2.5);
      const float s = exp_shift_sum(x.data(), n, 2.5f);
      EXPECT_NEAR(s, sum, 1e-6 * sum) << "n " << n;
      for (int64_t c = 0; c < n; ++c)
        EXPECT_NEAR(x[static_cast<size_t>(c)], e[static_cast<size_t>(c)], 2e-7 * e[static_cast<size_t>(c)]);
    }
  }
}

}  // namespace
}  // namespace coc::detail
