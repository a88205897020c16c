// RoPE forward against an fp64 reference, inverse undoes forward, and backward (= inverse) against finite
// differences of the fp64 forward.
#include <gtest/gtest.h>

#include <cmath>

#include "coc/kernels/transformer_ops.h"
#include "kernel_test_util.h"

namespace coc {
namespace {

using test::expect_close;
using test::to_f64;

struct Shape {
  int64_t s, b, heads, d;
};

// fp64 reference, rotate-half: for row r (position t = r / B), head j, i < D/2, angle t·theta^(−2i/D).
std::vector<double> ref_rope(const std::vector<double>& x, const Shape& sh, double theta) {
  std::vector<double> y(x);
  const int64_t cols = sh.heads * sh.d, half = sh.d / 2;
  for (int64_t r = 0; r < sh.s * sh.b; ++r) {
    const double t = static_cast<double>(r / sh.b);
    for (int64_t j = 0; j < sh.heads; ++j)
      for (int64_t i = 0; i < half; ++i) {
        const double a = t * std::pow(theta, -2.0 * i / sh.d);
        const int64_t p1 = r * cols + j * sh.d + i, p2 = p1 + half;
        y[p1] = x[p1] * std::cos(a) - x[p2] * std::sin(a);
        y[p2] = x[p2] * std::cos(a) + x[p1] * std::sin(a);
      }
  }
  return y;
}

class Rope : public testing::TestWithParam<Shape> {};

TEST_P(Rope, ForwardMatchesFp64AndInverseUndoesIt) {
  const Shape sh = GetParam();
  const float theta = 10000.0f;
  // x is a column slice of a fused buffer, as q and k are slices of qkv.
  Tensor buf({sh.s * sh.b, 2 * sh.heads * sh.d + 1});
  test::fill_uniform(buf.mat(), 11);
  MatrixView x = buf.mat().slice_cols(1, sh.heads * sh.d);
  const auto x0 = to_f64(x);
  const Tensor before = buf;
  rope_apply(x, sh.b, sh.heads, sh.d, theta, /*inverse=*/false);
  expect_close(x, ref_rope(x0, sh, theta), 1e-6, 1e-5, "rope forward");
  // Columns outside the view are untouched.
  for (int64_t r = 0; r < buf.rows(); ++r) {
    EXPECT_EQ(buf.mat().row(r)[0], before.mat().row(r)[0]);
    for (int64_t c = 1 + sh.heads * sh.d; c < buf.cols(); ++c) EXPECT_EQ(buf.mat().row(r)[c], before.mat().row(r)[c]);
  }
  rope_apply(x, sh.b, sh.heads, sh.d, theta, /*inverse=*/true);
  expect_close(x, x0, 1e-6, 1e-5, "inverse(forward(x))");
}

TEST_P(Rope, BackwardIsInverseAndMatchesFiniteDifferences) {
  const Shape sh = GetParam();
  const float theta = 500.0f;  // a small base makes every pair rotate noticeably even at S = 5
  Tensor x({sh.s * sh.b, sh.heads * sh.d}), dy({sh.s * sh.b, sh.heads * sh.d});
  test::fill_uniform(x.mat(), 12);
  test::fill_uniform(dy.mat(), 13);
  const auto xd = to_f64(x.mat()), dyd = to_f64(dy.mat());
  const auto g =
      test::fd_grad([&](const std::vector<double>& xv) { return test::dot(dyd, ref_rope(xv, sh, theta)); }, xd);
  rope_apply(dy.mat(), sh.b, sh.heads, sh.d, theta, /*inverse=*/true);  // dx = Rᵀ·dy, in place
  expect_close(dy.mat(), g, 1e-6, 1e-5, "rope backward");
}

INSTANTIATE_TEST_SUITE_P(Shapes, Rope,
                         testing::Values(Shape{5, 3, 2, 4}, Shape{1, 1, 1, 2}, Shape{1, 3, 2, 6}, Shape{7, 1, 3, 6},
                                         Shape{4, 2, 1, 8}),
                         [](const auto& info) {
                           const Shape& s = info.param;
                           return "S" + std::to_string(s.s) + "_B" + std::to_string(s.b) + "_H" +
                                  std::to_string(s.heads) + "_D" + std::to_string(s.d);
                         });

TEST(RopeSingle, PositionZeroIsIdentity) {
  Tensor x({3, 8});  // S = 1, B = 3: every row is position 0
  test::fill_uniform(x.mat(), 14);
  const auto x0 = to_f64(x.mat());
  rope_apply(x.mat(), 3, 2, 4, 10000.0f, false);
  expect_close(x.mat(), x0, 0.0, 0.0, "t = 0");
}

TEST(RopeSingle, LongSequenceKeepsPhase) {
  // Position 4095 with the fastest frequency: the angle is 4095 rad; an fp32 angle would be off by ~1e-4 rad.
  const int64_t S = 4096;
  Tensor x({S, 2});
  for (int64_t t = 0; t < S; ++t) {
    x.mat().row(t)[0] = 1.0f;
    x.mat().row(t)[1] = 0.0f;
  }
  rope_apply(x.mat(), 1, 1, 2, 10000.0f, false);
  for (int64_t t : {int64_t{1}, int64_t{1000}, S - 1}) {
    EXPECT_NEAR(x.mat().row(t)[0], std::cos(static_cast<double>(t)), 1e-6) << t;
    EXPECT_NEAR(x.mat().row(t)[1], std::sin(static_cast<double>(t)), 1e-6) << t;
  }
}

/// Element for element, the bits of `want` in `got` (same shape).
void expect_same_bits(ConstMatrixView got, ConstMatrixView want) {
  ASSERT_EQ(got.rows, want.rows);
  for (int64_t r = 0; r < got.rows; ++r)
    for (int64_t c = 0; c < got.cols; ++c) ASSERT_EQ(got.row(r)[c], want.row(r)[c]) << "row " << r << " col " << c;
}

TEST(RopeSingle, PositionOffsetRotatesAChunkAsTheWholeSequence) {
  // A chunk [p0, p0 + n) rotated with pos0 = p0 gives the rows of the whole sequence rotated from 0, bitwise
  // (context parallelism's zig-zag chunks, parallel/ring_attention.h).
  const int64_t S = 24, B = 3, heads = 2, D = 8, p0 = 10, n = 7;
  Tensor full({S * B, heads * D});
  test::fill_uniform(full.mat(), 42);
  Tensor chunk({n * B, heads * D});
  copy(full.mat().slice_rows(p0 * B, n * B), chunk.mat());
  rope_apply(full.mat(), B, heads, D, 10000.0f, false);
  rope_apply(chunk.mat(), B, heads, D, 10000.0f, false, p0);
  expect_same_bits(chunk.mat(), full.mat().slice_rows(p0 * B, n * B));
}

TEST(RopeSingle, AnyRowsGiveTheBitsOfTheWholeMatrix) {
  // rope_apply_rows on row ranges that cut through batch items (a CoC chunk's rows: TransformerLayer's qkv forward
  // rotates each as its GEMM finishes it), in any order, against rope_apply over all rows; empty ranges too.
  const int64_t S = 13, B = 3, heads = 2, D = 4;
  Tensor whole({S * B, heads * D}), parts({S * B, heads * D});
  test::fill_uniform(whole.mat(), 11);
  copy(whole.mat(), parts.mat());
  rope_apply(whole.mat(), B, heads, D, 10000.0f, false);
  const int64_t cuts[][2] = {{20, 7}, {0, 1}, {1, 5}, {27, 12}, {6, 14}, {5, 0}};  // [first, count), all 39 rows
  for (const auto& c : cuts) rope_apply_rows(parts.mat().slice_rows(c[0], c[1]), c[0], B, heads, D, 10000.0f, false);
  expect_same_bits(parts.mat(), whole.mat());
}

TEST(RopeSingle, RangesInAnyOrderGiveTheBitsOfOneCall) {
  // Attention's backward (--attention-qkv-backward-pipeline) rotates dQ back block by block, from the last block
  // down, each call reading the positions it covers from one table: the bits of one call over every row, also after
  // a call with another theta on a longer sequence, whose table must not serve them.
  const int64_t S = 40, B = 2, heads = 3, D = 6;
  Tensor whole({S * B, heads * D}), parts({S * B, heads * D});
  test::fill_uniform(whole.mat(), 7);
  copy(whole.mat(), parts.mat());
  rope_apply(whole.mat(), B, heads, D, 10000.0f, true);
  Tensor other({(S + 5) * B, heads * D});
  rope_apply(other.mat(), B, heads, D, 500000.0f, false);
  const int64_t blocks[][2] = {{33, S}, {20, 33}, {3, 20}, {0, 3}};  // positions [begin, end), the last first
  for (const auto& b : blocks)
    rope_apply(parts.mat().slice_rows(b[0] * B, (b[1] - b[0]) * B), B, heads, D, 10000.0f, true, b[0]);
  expect_same_bits(parts.mat(), whole.mat());
}

}  // namespace
}  // namespace coc
