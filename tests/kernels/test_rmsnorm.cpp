// RMSNorm forward against an fp64 reference, backward against central finite differences of that reference.
#include <gtest/gtest.h>

#include <cmath>

#include "coc/kernels/transformer_ops.h"
#include "kernel_test_util.h"

namespace coc {
namespace {

using test::expect_close;
using test::to_f64;

// fp64 reference: y[i, j] = x[i, j] / sqrt(mean_j x² + eps) · w[j]; x row-major [m, h].
std::vector<double> ref_rmsnorm(const std::vector<double>& x, const std::vector<double>& w, int64_t m, int64_t h,
                                double eps) {
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < m; ++i) {
    double ss = 0.0;
    for (int64_t j = 0; j < h; ++j) ss += x[i * h + j] * x[i * h + j];
    const double r = 1.0 / std::sqrt(ss / h + eps);
    for (int64_t j = 0; j < h; ++j) y[i * h + j] = x[i * h + j] * r * w[j];
  }
  return y;
}

struct Shape {
  int64_t m, h;
};

class RmsNorm : public testing::TestWithParam<Shape> {};

TEST_P(RmsNorm, ForwardMatchesFp64) {
  const auto [m, h] = GetParam();
  const float eps = 1e-5f;
  // x is a strided view (column slice of a wider matrix), as when the caller normalises part of a buffer.
  Tensor xbuf({m, h + 3});
  test::fill_uniform(xbuf.mat(), 1, -2.0f, 2.0f);
  ConstMatrixView x = xbuf.mat().slice_cols(2, h);
  auto w = test::uniform_vec(h, 2, 0.5f, 1.5f);
  Tensor y({m, h});
  std::vector<float> rstd(static_cast<size_t>(m));
  rmsnorm_forward(x, w.data(), eps, y.mat(), rstd.data());
  const auto xd = to_f64(x);
  expect_close(y.mat(), ref_rmsnorm(xd, to_f64(w.data(), h), m, h, eps), 1e-6, 1e-5, "y");
  std::vector<double> rref(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    double ss = 0.0;
    for (int64_t j = 0; j < h; ++j) ss += xd[i * h + j] * xd[i * h + j];
    rref[i] = 1.0 / std::sqrt(ss / h + eps);
  }
  expect_close(rstd.data(), rref, 1e-6, 1e-5, "rstd");

  // In place (y aliases x) gives the same result.
  Tensor xi({m, h});
  copy(x, xi.mat());
  rmsnorm_forward(xi.mat(), w.data(), eps, xi.mat(), rstd.data());
  expect_close(xi.mat(), to_f64(y.mat()), 0.0, 0.0, "in-place y");
}

TEST_P(RmsNorm, BackwardMatchesFiniteDifferences) {
  const auto [m, h] = GetParam();
  const float eps = 1e-5f;
  Tensor x({m, h}), dy({m, h});
  test::fill_uniform(x.mat(), 3, -2.0f, 2.0f);
  test::fill_uniform(dy.mat(), 4);
  auto w = test::uniform_vec(h, 5, 0.5f, 1.5f);
  Tensor y({m, h});
  std::vector<float> rstd(static_cast<size_t>(m));
  rmsnorm_forward(x.mat(), w.data(), eps, y.mat(), rstd.data());

  // dw accumulates onto what is there; dx overwrites (first) or adds (accumulate_dx).
  std::vector<float> dw(static_cast<size_t>(h), 0.25f);
  Tensor dx({m, h});
  dx.fill(7.0f);  // must be overwritten
  rmsnorm_backward(x.mat(), w.data(), rstd.data(), dy.mat(), dx.mat(), dw.data(), /*accumulate_dx=*/false);

  const auto xd = to_f64(x.mat()), dyd = to_f64(dy.mat()), wd = to_f64(w.data(), h);
  const auto gx =
      test::fd_grad([&](const std::vector<double>& xv) { return test::dot(dyd, ref_rmsnorm(xv, wd, m, h, eps)); }, xd);
  auto gw =
      test::fd_grad([&](const std::vector<double>& wv) { return test::dot(dyd, ref_rmsnorm(xd, wv, m, h, eps)); }, wd);
  expect_close(dx.mat(), gx, 1e-5, 1e-4, "dx");
  for (auto& g : gw) g += 0.25;
  expect_close(dw.data(), gw, 1e-5, 1e-4, "dw (accumulated)");

  Tensor dx2({m, h});
  dx2.fill(1.5f);
  rmsnorm_backward(x.mat(), w.data(), rstd.data(), dy.mat(), dx2.mat(), dw.data(), /*accumulate_dx=*/true);
  std::vector<double> expect(gx);
  for (auto& g : expect) g += 1.5;
  expect_close(dx2.mat(), expect, 1e-5, 1e-4, "dx (accumulate_dx)");
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNorm, testing::Values(Shape{15, 7}, Shape{1, 5}, Shape{3, 1}, Shape{5, 64}),
                         [](const auto& info) {
                           return "m" + std::to_string(info.param.m) + "_h" + std::to_string(info.param.h);
                         });

}  // namespace
}  // namespace coc
