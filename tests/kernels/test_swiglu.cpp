// SwiGLU forward against fp64, backward against central finite differences and an fp64 analytic reference.
#include <gtest/gtest.h>

#include <cmath>

#include "coc/core/bf16.h"
#include "coc/kernels/transformer_ops.h"
#include "kernel_test_util.h"

namespace coc {
namespace {

using test::expect_close;
using test::to_f64;

std::vector<double> ref_swiglu(const std::vector<double>& g, const std::vector<double>& u) {
  std::vector<double> o(g.size());
  for (size_t i = 0; i < g.size(); ++i) o[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  return o;
}

struct Shape {
  int64_t m, f;
};
class SwiGlu : public testing::TestWithParam<Shape> {};

TEST_P(SwiGlu, ForwardMatchesFp64) {
  const auto [m, f] = GetParam();
  // gate and up as the two halves of a fused [M, 2F] fc1 output (Megatron's fused gate/up projection).
  Tensor fc1({m, 2 * f});
  test::fill_uniform(fc1.mat(), 31, -4.0f, 4.0f);
  ConstMatrixView gate = fc1.mat().slice_cols(0, f), up = fc1.mat().slice_cols(f, f);
  Tensor out({m, f});
  swiglu_forward(gate, up, out.mat());
  const auto expect = ref_swiglu(to_f64(gate), to_f64(up));
  expect_close(out.mat(), expect, 1e-6, 1e-5, "out");
  // out may alias gate.
  Tensor g2({m, f});
  copy(gate, g2.mat());
  swiglu_forward(g2.mat(), up, g2.mat());
  expect_close(g2.mat(), expect, 1e-6, 1e-5, "out aliasing gate");
}

TEST_P(SwiGlu, BackwardMatchesFiniteDifferences) {
  const auto [m, f] = GetParam();
  Tensor gate({m, f}), up({m, f}), dout({m, f}), dgate({m, f}), dup({m, f});
  test::fill_uniform(gate.mat(), 32, -4.0f, 4.0f);
  test::fill_uniform(up.mat(), 33);
  test::fill_uniform(dout.mat(), 34);
  dgate.fill(5.0f);
  dup.fill(5.0f);
  swiglu_backward(gate.mat(), up.mat(), dout.mat(), dgate.mat(), dup.mat());
  const auto gd = to_f64(gate.mat()), ud = to_f64(up.mat()), dd = to_f64(dout.mat());
  const auto fg = test::fd_grad([&](const std::vector<double>& x) { return test::dot(dd, ref_swiglu(x, ud)); }, gd);
  const auto fu = test::fd_grad([&](const std::vector<double>& x) { return test::dot(dd, ref_swiglu(gd, x)); }, ud);
  expect_close(dgate.mat(), fg, 1e-6, 1e-5, "dgate vs finite differences");
  expect_close(dup.mat(), fu, 1e-6, 1e-5, "dup vs finite differences");
  // fp64 analytic: d silu(g)/dg = σ(g)·(1 + g·(1 − σ(g))).
  std::vector<double> ag(gd.size());
  for (size_t i = 0; i < gd.size(); ++i) {
    const double s = 1.0 / (1.0 + std::exp(-gd[i]));
    ag[i] = dd[i] * ud[i] * s * (1.0 + gd[i] * (1.0 - s));
  }
  expect_close(dgate.mat(), ag, 1e-6, 1e-5, "dgate vs analytic");
  // dgate may alias dout.
  Tensor d2 = dout;
  swiglu_backward(gate.mat(), up.mat(), d2.mat(), d2.mat(), dup.mat());
  expect_close(d2.mat(), ag, 1e-6, 1e-5, "dgate aliasing dout");
}

// 37 columns: the vectorised loops' full groups and their scalar tail.
INSTANTIATE_TEST_SUITE_P(Shapes, SwiGlu,
                         testing::Values(Shape{15, 7}, Shape{1, 1}, Shape{1, 9}, Shape{5, 3}, Shape{3, 37}),
                         [](const auto& info) {
                           return "m" + std::to_string(info.param.m) + "_f" + std::to_string(info.param.f);
                         });

TEST(SwiGluSingle, ExtremeGatesStayFinite) {
  // 37 gates from −200 to 200 (past fast_exp's clamps at −87.3 and 88 on both sides), through the vectorised loops
  // and their tail.
  constexpr int kN = 37;
  Tensor gate({1, kN}), up({1, kN}), out({1, kN}), dout({1, kN}), dg({1, kN}), du({1, kN});
  for (int i = 0; i < kN; ++i) {
    gate[i] = -200.0f + 400.0f * static_cast<float>(i) / (kN - 1);
    up[i] = 1.0f;
    dout[i] = 1.0f;
  }
  swiglu_forward(gate.mat(), up.mat(), out.mat());
  swiglu_backward(gate.mat(), up.mat(), dout.mat(), dg.mat(), du.mat());
  for (int i = 0; i < kN; ++i) {
    const float g = gate[i];
    EXPECT_TRUE(std::isfinite(out[i]) && std::isfinite(dg[i]) && std::isfinite(du[i])) << g;
    if (std::abs(g) < 30.0f) continue;  // the limits below hold to 1e-4 only far from 0
    // silu(g) → 0 for g → −∞ and → g for g → +∞; its slope → 0 and → 1.
    EXPECT_NEAR(out[i], g > 0 ? g : 0.0f, 1e-4f) << g;
    EXPECT_NEAR(dg[i], g > 0 ? 1.0f : 0.0f, 1e-4f) << g;
  }
}

// The bf16 outputs for the linear layers' GEMMs are fp32_to_bf16 of the fp32 ones, on strided rows, also when the
// outputs alias an input.
TEST(SwiGLU, Bf16OutputsAreTheFp32OnesRounded) {
  const int64_t M = 5, F = 19;
  Tensor gate({M, F}), up({M, F}), dout({M, F}), dg({M, F}), du({M, F}), d2({M, F});
  test::fill_uniform(gate.mat(), 71, -3.0f, 3.0f);
  test::fill_uniform(up.mat(), 72);
  test::fill_uniform(dout.mat(), 73);
  std::copy(dout.data(), dout.data() + dout.numel(), d2.data());
  swiglu_backward(gate.mat(), up.mat(), dout.mat(), dg.mat(), du.mat());
  std::vector<BFloat16> both(M * 2 * F), want(M * F);
  const MatrixViewT<BFloat16> b{both.data(), M, 2 * F, 2 * F};
  Tensor out({M, F}), g2({M, F});
  std::copy(gate.data(), gate.data() + gate.numel(), g2.data());
  swiglu_forward(gate.mat(), up.mat(), out.mat());
  swiglu_forward(g2.mat(), up.mat(), g2.mat(), b.slice_cols(0, F));  // out aliases gate
  fp32_to_bf16(out.data(), want.data(), M * F);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < F; ++j)
      EXPECT_EQ(b.row(i)[j].bits, want[static_cast<size_t>(i * F + j)].bits) << "forward " << i << "," << j;
  swiglu_backward(gate.mat(), up.mat(), d2.mat(), d2.mat(), du.mat(), b.slice_cols(0, F), b.slice_cols(F, F));
  for (const auto& [fp32, col] : {std::pair{&dg, int64_t{0}}, std::pair{&du, F}}) {
    fp32_to_bf16(fp32->data(), want.data(), M * F);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < F; ++j)
        EXPECT_EQ(b.row(i)[col + j].bits, want[static_cast<size_t>(i * F + j)].bits) << i << "," << col + j;
  }
}

}  // namespace
}  // namespace coc
