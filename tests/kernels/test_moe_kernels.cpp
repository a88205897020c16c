// The MoE kernels (coc/kernels/moe.h) against fp64 references: the grouped GEMM forward and backward (with empty
// groups), the softmax top-k router and its backward, the fixed router patterns, Megatron's capacity dropping and
// the load-balancing loss with its gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "coc/kernels/moe.h"

namespace coc {
namespace {

std::vector<float> rnd(int64_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(g);
  return v;
}

double rel(const std::vector<float>& got, const std::vector<double>& ref) {
  double e = 0, s = 1e-30;
  for (size_t i = 0; i < ref.size(); ++i) {
    e = std::max(e, std::fabs(got[i] - ref[i]));
    s = std::max(s, std::fabs(ref[i]));
  }
  return e / s;
}

TEST(MoeKernels, GroupedGemmMatchesPerGroupProductsAndEmptyGroupsGetZeroGradient) {
  const std::vector<int64_t> rows{5, 0, 17, 1};
  const int64_t G = 4, M = 23, k = 12, n = 9;
  const auto x = rnd(M * k, 1), w = rnd(G * n * k, 2), dy = rnd(M * n, 3);
  std::vector<float> y(M * n), dx(M * k), dw(G * n * k, 0.0f);
  grouped_gemm_forward({x.data(), M, k, k}, rows, {w.data(), G * n, k, k}, {y.data(), M, n, n});
  grouped_gemm_backward_data({dy.data(), M, n, n}, rows, {w.data(), G * n, k, k}, {dx.data(), M, k, k});
  grouped_gemm_backward_weight({x.data(), M, k, k}, {dy.data(), M, n, n}, rows, {dw.data(), G * n, k, k});
  std::vector<double> ry(M * n, 0), rdx(M * k, 0), rdw(G * n * k, 0);
  int64_t off = 0;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = off; r < off + rows[g]; ++r)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < k; ++i) {
          const double wv = w[(g * n + j) * k + i];
          ry[r * n + j] += x[r * k + i] * wv;
          rdx[r * k + i] += dy[r * n + j] * wv;
          rdw[(g * n + j) * k + i] += static_cast<double>(dy[r * n + j]) * x[r * k + i];
        }
    off += rows[g];
  }
  EXPECT_LE(rel(y, ry), 1e-6);
  EXPECT_LE(rel(dx, rdx), 1e-6);
  EXPECT_LE(rel(dw, rdw), 1e-6);
  for (int64_t i = n * k; i < 2 * n * k; ++i) ASSERT_EQ(dw[i], 0.0f);  // group 1 has no rows
}

TEST(MoeKernels, TopKPicksTheLargestProbabilitiesAndTheBackwardIsTheSoftmaxJacobian) {
  const int64_t T = 9;
  const int E = 5, K = 2;
  const auto logits = rnd(T * E, 4), dw = rnd(T * K, 5), extra = rnd(T * E, 6);
  const Routing r = route_topk({logits.data(), T, E, E}, K, RouterPattern::kNone, 0, 0);
  std::vector<float> dl(T * E);
  route_topk_backward(r, dw, extra, {dl.data(), T, E, E});
  std::vector<double> rdl(T * E);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> p(E);
    double mx = -1e300, s = 0;
    for (int e = 0; e < E; ++e) mx = std::max(mx, static_cast<double>(logits[t * E + e]));
    for (int e = 0; e < E; ++e) s += (p[e] = std::exp(logits[t * E + e] - mx));
    for (double& v : p) v /= s;
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    std::vector<double> dp(E);
    for (int e = 0; e < E; ++e) dp[e] = extra[t * E + e];
    for (int j = 0; j < K; ++j) {
      EXPECT_EQ(r.expert[t * K + j], order[j]) << t;
      EXPECT_NEAR(r.weight[t * K + j], p[order[j]], 1e-6);
      dp[order[j]] += dw[t * K + j];
    }
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += p[e] * dp[e];
    for (int e = 0; e < E; ++e) rdl[t * E + e] = p[e] * (dp[e] - dot);
  }
  EXPECT_LE(rel(dl, rdl), 1e-5);
  EXPECT_EQ(std::accumulate(r.counts.begin(), r.counts.end(), int64_t{0}), T * K);
}

TEST(MoeKernels, FixedPatternsRouteAsDefined) {
  const int64_t T = 40;
  const int E = 4;
  const std::vector<float> logits(T * E, 0.0f);
  const Routing bal = route_topk({logits.data(), T, E, E}, 2, RouterPattern::kBalanced, 3, 0);
  for (int e = 0; e < E; ++e) EXPECT_EQ(bal.counts[e], T * 2 / E);
  EXPECT_EQ(bal.expert[0], 3);  // token 3 (offset), slot 0
  const Routing skew = route_topk({logits.data(), T, E, E}, 1, RouterPattern::kSkewed, 0, 0);
  EXPECT_EQ(skew.counts[0], 36);  // 90%
  const Routing empty = route_topk({logits.data(), T, E, E}, 1, RouterPattern::kEmpty, 0, 0);
  EXPECT_EQ(empty.counts[2] + empty.counts[3], 0);
  EXPECT_FLOAT_EQ(empty.weight[0], 0.25f);  // the router's probability of the forced expert
}

TEST(MoeKernels, CapacityKeepsTheHighestProbabilitySlotsPerExpert) {
  const int64_t T = 40;
  const int E = 4, K = 1;
  auto logits = rnd(T * E, 7);
  for (int64_t t = 0; t < T; ++t) logits[t * E] += 5;  // everyone prefers expert 0
  const double cf = 1.0;
  const int64_t cap = expert_capacity(T, K, E, cf);
  EXPECT_EQ(cap, 10);
  const Routing r = route_topk({logits.data(), T, E, E}, K, RouterPattern::kNone, 0, cf);
  int64_t kept0 = 0;
  float min_kept = 2, max_dropped = -1;
  for (int64_t t = 0; t < T; ++t)
    if (r.expert[t] == 0) {
      const float p = r.probs[t * E];
      if (r.kept[t]) {
        ++kept0;
        min_kept = std::min(min_kept, p);
      } else {
        max_dropped = std::max(max_dropped, p);
        EXPECT_EQ(r.weight[t], 0.0f);
      }
    }
  EXPECT_EQ(kept0, cap);
  EXPECT_GE(min_kept, max_dropped);
  EXPECT_EQ(r.counts[0], 40);  // the aux loss counts slots before dropping
}

TEST(MoeKernels, AuxLossIsCoeffTimesESumOfFractionTimesMeanProbability) {
  const std::vector<int64_t> counts{30, 10, 0, 40};
  const std::vector<double> psums{12.5, 7.5, 0.5, 19.5};
  const int64_t T = 40;
  const int K = 2;
  const double v = aux_loss_value(counts, psums, T, K, 0.01);
  double ref = 0;
  for (int e = 0; e < 4; ++e) ref += counts[e] / double(T * K) * psums[e] / T;
  EXPECT_NEAR(v, 0.01 * 4 * ref, 1e-15);
  std::vector<float> d(3 * 4, 0.0f);
  aux_loss_backward(counts, T, K, 0.01, 2.0, {d.data(), 3, 4, 4});
  for (int t = 0; t < 3; ++t)
    for (int e = 0; e < 4; ++e) EXPECT_FLOAT_EQ(d[t * 4 + e], static_cast<float>(2.0 * 0.01 * 4 * counts[e] / double(T * K) / T));
  EXPECT_EQ(aux_loss_value(counts, psums, 0, K, 0.01), 0.0);
}

}  // namespace
}  // namespace coc
