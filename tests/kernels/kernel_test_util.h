// Shared helpers for the single-process kernel tests: seeded random data, fp64 copies, closeness checks and a
// central finite-difference gradient of an fp64 scalar function.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "coc/core/tensor.h"

namespace coc::test {

/// Fills every element of m with U(lo, hi) from a fixed seed (tests must be reproducible).
inline void fill_uniform(MatrixView m, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) m.row(i)[j] = d(rng);
}
inline std::vector<float> uniform_vec(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

/// Row-major fp64 copy of a (possibly strided) view: element (i, j) at [i·cols + j].
inline std::vector<double> to_f64(ConstMatrixView m) {
  std::vector<double> out(static_cast<size_t>(m.rows * m.cols));
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) out[static_cast<size_t>(i * m.cols + j)] = m.row(i)[j];
  return out;
}
inline std::vector<double> to_f64(const float* p, int64_t n) { return std::vector<double>(p, p + n); }

/// Expects |actual − expected| <= atol + rtol·|expected| element-wise; reports the first few misses.
inline void expect_close(ConstMatrixView actual, const std::vector<double>& expected, double atol, double rtol,
                         const std::string& what) {
  ASSERT_EQ(static_cast<size_t>(actual.rows * actual.cols), expected.size()) << what;
  int misses = 0;
  for (int64_t i = 0; i < actual.rows; ++i)
    for (int64_t j = 0; j < actual.cols; ++j) {
      const double e = expected[static_cast<size_t>(i * actual.cols + j)];
      const double a = actual.row(i)[j];
      if (!(std::abs(a - e) <= atol + rtol * std::abs(e)) && misses++ < 5)
        ADD_FAILURE() << what << " (" << i << ", " << j << "): got " << a << ", expected " << e;
    }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " elements out of tolerance";
}
inline void expect_close(const float* actual, const std::vector<double>& expected, double atol, double rtol,
                         const std::string& what) {
  const auto n = static_cast<int64_t>(expected.size());
  expect_close(ConstMatrixView{actual, 1, n, n}, expected, atol, rtol, what);
}

/// Central finite differences of f at x in fp64: g_i = (f(x + h·e_i) − f(x − h·e_i)) / 2h. Truncation error is
/// O(h²·f''') ≈ 1e-10 for h = 1e-5 on these smooth functions, far below the fp32 error of the kernels under test.
inline std::vector<double> fd_grad(const std::function<double(const std::vector<double>&)>& f, std::vector<double> x,
                                   double h = 1e-5) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2.0 * h);
  }
  return g;
}

/// Σ a_i·b_i in fp64: the scalar loss L = <dy, y> whose gradient w.r.t. the inputs is what backward computes.
inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace coc::test
