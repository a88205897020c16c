// Vocab-parallel cross-entropy pieces. The TP collectives are simulated in-process: the [M, V] logits are cut into
// uneven vocab slices (as T ranks would hold them), the MAX and SUM all-reduces are done by hand, and the result
// is compared with an fp64 log-softmax reference. Backward is checked against the fp64 analytic gradient and
// against central finite differences of the fp64 loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "coc/kernels/cross_entropy.h"
#include "kernel_test_util.h"

namespace coc {
namespace {

using test::expect_close;
using test::to_f64;

// fp64 reference: loss_i = logsumexp(x_i) − x_i[target_i]; x row-major [m, v].
std::vector<double> ref_loss(const std::vector<double>& x, const std::vector<int32_t>& tgt, int64_t m, int64_t v) {
  std::vector<double> loss(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    double mx = -INFINITY;
    for (int64_t c = 0; c < v; ++c) mx = std::max(mx, x[i * v + c]);
    double s = 0.0;
    for (int64_t c = 0; c < v; ++c) s += std::exp(x[i * v + c] - mx);
    loss[i] = std::log(s) + mx - x[i * v + tgt[i]];
  }
  return loss;
}

struct Result {
  std::vector<float> loss;
  Tensor dlogits;  // [M, V], the concatenation of every slice's dlogits
};

// Runs the four steps over vocab slices of the given sizes (summing to V), reducing by hand between steps.
Result run_parallel(const Tensor& logits, const std::vector<int32_t>& tgt, const std::vector<int64_t>& slices,
                    float scale) {
  const int64_t M = logits.rows(), V = logits.cols();
  std::vector<float> gmax(static_cast<size_t>(M), -INFINITY), sum(static_cast<size_t>(M), 0.0f),
      target(static_cast<size_t>(M), 0.0f), local_a(static_cast<size_t>(M)), local_b(static_cast<size_t>(M));
  auto slice = [&](int64_t begin, int64_t n) { return logits.mat().slice_cols(begin, n); };
  int64_t begin = 0;
  for (int64_t n : slices) {  // step 1 + all-reduce MAX
    vocab_ce_row_max(slice(begin, n), local_a.data());
    for (int64_t i = 0; i < M; ++i) gmax[i] = std::max(gmax[i], local_a[i]);
    begin += n;
  }
  EXPECT_EQ(begin, V);
  begin = 0;
  for (int64_t n : slices) {  // step 2 + all-reduce SUM
    vocab_ce_sum_exp(slice(begin, n), gmax.data(), tgt.data(), begin, local_a.data(), local_b.data());
    for (int64_t i = 0; i < M; ++i) {
      sum[i] += local_a[i];
      target[i] += local_b[i];
    }
    begin += n;
  }
  Result r{std::vector<float>(static_cast<size_t>(M)), Tensor({M, V})};
  vocab_ce_loss(M, sum.data(), target.data(), r.loss.data());
  begin = 0;
  for (int64_t n : slices) {  // step 4, per rank
    vocab_ce_backward(slice(begin, n), gmax.data(), sum.data(), tgt.data(), begin, scale,
                      r.dlogits.mat().slice_cols(begin, n));
    begin += n;
  }
  return r;
}

std::vector<int32_t> targets(int64_t m, int64_t v) {
  std::vector<int32_t> t(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) t[i] = static_cast<int32_t>((i * 7 + 3) % v);  // spread over every slice
  return t;
}

struct Case {
  int64_t m;
  std::vector<int64_t> slices;
};
class VocabCe : public testing::TestWithParam<Case> {};

TEST_P(VocabCe, LossAndGradientMatchFp64) {
  const Case& c = GetParam();
  int64_t V = 0;
  for (int64_t n : c.slices) V += n;
  Tensor logits({c.m, V});
  test::fill_uniform(logits.mat(), 51, -3.0f, 3.0f);
  const auto tgt = targets(c.m, V);
  const float scale = 1.0f / static_cast<float>(c.m);  // mean over tokens
  const Result r = run_parallel(logits, tgt, c.slices, scale);
  const auto xd = to_f64(logits.mat());
  expect_close(r.loss.data(), ref_loss(xd, tgt, c.m, V), 1e-6, 1e-5, "loss");

  // Analytic fp64: (softmax − onehot)·scale.
  std::vector<double> g(xd.size());
  for (int64_t i = 0; i < c.m; ++i) {
    double mx = -INFINITY, s = 0.0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, xd[i * V + v]);
    for (int64_t v = 0; v < V; ++v) s += std::exp(xd[i * V + v] - mx);
    for (int64_t v = 0; v < V; ++v) g[i * V + v] = (std::exp(xd[i * V + v] - mx) / s - (v == tgt[i])) * scale;
  }
  expect_close(r.dlogits.mat(), g, 1e-7, 1e-5, "dlogits vs analytic");
  // Finite differences of L = scale · Σ_i loss_i.
  const auto fd = test::fd_grad(
      [&](const std::vector<double>& x) {
        double l = 0.0;
        for (double li : ref_loss(x, tgt, c.m, V)) l += li;
        return l * scale;
      },
      xd);
  expect_close(r.dlogits.mat(), fd, 1e-7, 1e-5, "dlogits vs finite differences");
}

INSTANTIATE_TEST_SUITE_P(Splits, VocabCe,
                         testing::Values(Case{5, {11}}, Case{5, {4, 4, 3}}, Case{1, {3, 1, 2}}, Case{7, {5, 0, 6}},
                                         Case{3, {1, 1, 1, 1, 1}}),
                         [](const auto& info) {
                           std::string n = "m" + std::to_string(info.param.m) + "_v";
                           for (int64_t s : info.param.slices) n += std::to_string(s) + "x";
                           return n;
                         });

TEST(VocabCeSingle, LargeLogitsAreStable) {
  // Logits around 1e4 would overflow exp() without the max shift; the loss only depends on differences.
  const int64_t M = 3, V = 6;
  Tensor logits({M, V});
  test::fill_uniform(logits.mat(), 52, -2.0f, 2.0f);
  const auto tgt = targets(M, V);
  const Result base = run_parallel(logits, tgt, {2, 4}, 1.0f);
  for (int64_t i = 0; i < logits.numel(); ++i) logits[i] += 1.0e4f;
  const Result big = run_parallel(logits, tgt, {2, 4}, 1.0f);
  for (int64_t i = 0; i < M; ++i) {
    ASSERT_TRUE(std::isfinite(big.loss[i]));
    EXPECT_NEAR(big.loss[i], base.loss[i], 2e-3);  // 1e4 + x is rounded to ~1e-3 in fp32
  }
  for (int64_t i = 0; i < big.dlogits.numel(); ++i) EXPECT_TRUE(std::isfinite(big.dlogits[i]));
}

TEST(VocabCeSingle, TargetOutsideSliceContributesZero) {
  Tensor logits({2, 3});
  test::fill_uniform(logits.mat(), 53);
  const std::vector<int32_t> tgt = {1, 7};  // with vocab_begin 5: row 0 below the slice, row 1 at local 2
  const float gmax[2] = {5.0f, 5.0f};
  float se[2], zt[2];
  vocab_ce_sum_exp(logits.mat(), gmax, tgt.data(), 5, se, zt);
  EXPECT_EQ(zt[0], 0.0f);
  EXPECT_FLOAT_EQ(zt[1], logits.mat().row(1)[2] - 5.0f);
  // Empty slice: max is −inf (MAX identity), sum 0.
  Tensor empty({2, 0});
  float mx[2];
  vocab_ce_row_max(empty.mat(), mx);
  EXPECT_TRUE(std::isinf(mx[0]) && mx[0] < 0);
}

TEST(VocabCeSingle, BackwardMayOverwriteLogits) {
  const int64_t M = 4, V = 5;
  Tensor logits({M, V});
  test::fill_uniform(logits.mat(), 54);
  const auto tgt = targets(M, V);
  const Result r = run_parallel(logits, tgt, {V}, 0.5f);
  std::vector<float> mx(M), se(M), zt(M);
  vocab_ce_row_max(logits.mat(), mx.data());
  vocab_ce_sum_exp(logits.mat(), mx.data(), tgt.data(), 0, se.data(), zt.data());
  vocab_ce_backward(logits.mat(), mx.data(), se.data(), tgt.data(), 0, 0.5f, logits.mat());
  expect_close(logits.mat(), to_f64(r.dlogits.mat()), 0.0, 0.0, "in-place dlogits");
}

}  // namespace
}  // namespace coc
