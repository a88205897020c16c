// MoE kernels: grouped GEMM, softmax top-k routing with capacity dropping, load-balancing loss (kernels/moe.h).
#include "coc/kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "coc/core/error.h"
#include "coc/kernels/gemm.h"
#include "coc/runtime/tracer.h"

namespace coc {

namespace {
int64_t total_rows(std::span<const int64_t> rows) { return std::accumulate(rows.begin(), rows.end(), int64_t{0}); }
}  // namespace

void grouped_gemm_forward(ConstMatrixView x, std::span<const int64_t> rows, ConstMatrixView w, MatrixView y) {
  const auto G = static_cast<int64_t>(rows.size());
  COC_ASSERT(G > 0 && w.rows % G == 0 && x.rows == total_rows(rows) && y.rows == x.rows && w.cols == x.cols &&
                 y.cols == w.rows / G,
             "grouped_gemm_forward: x [{}, {}], {} groups of {} rows, w [{}, {}], y [{}, {}]", x.rows, x.cols, G,
             total_rows(rows), w.rows, w.cols, y.rows, y.cols);
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "grouped_gemm", {"m", x.rows}, {"k", x.cols},
                  {"n", y.cols}, {"groups", G});
  const int64_t n = w.rows / G;
  int64_t off = 0;
  for (int64_t g = 0; g < G; ++g) {
    if (rows[g] > 0) gemm(x.slice_rows(off, rows[g]), false, w.slice_rows(g * n, n), true, y.slice_rows(off, rows[g]));
    off += rows[g];
  }
}

void grouped_gemm_backward_data(ConstMatrixView dy, std::span<const int64_t> rows, ConstMatrixView w, MatrixView dx) {
  const auto G = static_cast<int64_t>(rows.size());
  COC_ASSERT(G > 0 && w.rows % G == 0 && dy.rows == total_rows(rows) && dx.rows == dy.rows &&
                 dy.cols == w.rows / G && dx.cols == w.cols,
             "grouped_gemm_backward_data: dy [{}, {}], {} groups of {} rows, w [{}, {}], dx [{}, {}]", dy.rows,
             dy.cols, G, total_rows(rows), w.rows, w.cols, dx.rows, dx.cols);
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "grouped_gemm_dx", {"m", dy.rows}, {"k", dy.cols},
                  {"n", dx.cols}, {"groups", G});
  const int64_t n = w.rows / G;
  int64_t off = 0;
  for (int64_t g = 0; g < G; ++g) {
    if (rows[g] > 0)
      gemm(dy.slice_rows(off, rows[g]), false, w.slice_rows(g * n, n), false, dx.slice_rows(off, rows[g]));
    off += rows[g];
  }
}

void grouped_gemm_backward_weight(ConstMatrixView x, ConstMatrixView dy, std::span<const int64_t> rows,
                                  MatrixView dw) {
  const auto G = static_cast<int64_t>(rows.size());
  COC_ASSERT(G > 0 && dw.rows % G == 0 && x.rows == total_rows(rows) && dy.rows == x.rows &&
                 dy.cols == dw.rows / G && x.cols == dw.cols,
             "grouped_gemm_backward_weight: x [{}, {}], dy [{}, {}], {} groups of {} rows, dw [{}, {}]", x.rows,
             x.cols, dy.rows, dy.cols, G, total_rows(rows), dw.rows, dw.cols);
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "grouped_gemm_dw", {"m", x.rows}, {"k", x.cols},
                  {"n", dy.cols}, {"groups", G});
  const int64_t n = dw.rows / G;
  int64_t off = 0;
  for (int64_t g = 0; g < G; ++g) {
    if (rows[g] > 0)
      gemm(dy.slice_rows(off, rows[g]), true, x.slice_rows(off, rows[g]), false, dw.slice_rows(g * n, n), 1.0f,
           1.0f);
    off += rows[g];
  }
}

const char* to_string(RouterPattern p) {
  switch (p) {
    case RouterPattern::kNone: return "none";
    case RouterPattern::kBalanced: return "balanced";
    case RouterPattern::kSkewed: return "skewed";
    case RouterPattern::kEmpty: return "empty";
  }
  return "?";
}

int64_t expert_capacity(int64_t tokens, int topk, int experts, double capacity_factor) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(tokens) * topk / experts * capacity_factor));
}

namespace {
/// The fixed expert of slot j of the token with global index g (RouterPattern).
int fixed_expert(RouterPattern p, int64_t g, int j, int E, int K) {
  switch (p) {
    case RouterPattern::kBalanced: return static_cast<int>((g + j) % E);
    case RouterPattern::kSkewed: {
      const int first = (g % 10 != 9 || E == 1) ? 0 : 1 + static_cast<int>(g % (E - 1));
      return (first + j) % E;
    }
    case RouterPattern::kEmpty: {
      const int used = std::max(K, E / 2);
      return static_cast<int>((g + j) % used);
    }
    case RouterPattern::kNone: break;
  }
  return 0;
}
}  // namespace

Routing route_topk(ConstMatrixView logits, int topk, RouterPattern pattern, int64_t token_offset,
                   double capacity_factor) {
  const int64_t T = logits.rows;
  const int E = static_cast<int>(logits.cols);
  COC_ASSERT(E > 0 && topk >= 1 && topk <= E, "route_topk: {} experts, top-k {}", E, topk);
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "router_topk", {"tokens", T}, {"experts", E});
  Routing r;
  r.tokens = T;
  r.experts = E;
  r.topk = topk;
  r.probs.resize(static_cast<size_t>(T * E));
  r.expert.resize(static_cast<size_t>(T * topk));
  r.weight.resize(static_cast<size_t>(T * topk));
  r.kept.assign(static_cast<size_t>(T * topk), 1);
  r.counts.assign(static_cast<size_t>(E), 0);
  r.prob_sums.assign(static_cast<size_t>(E), 0.0);
  std::vector<int> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits.row(t);
    float* p = r.probs.data() + t * E;
    const float mx = *std::max_element(l, l + E);
    float s = 0;
    for (int e = 0; e < E; ++e) s += (p[e] = std::exp(l[e] - mx));
    for (int e = 0; e < E; ++e) p[e] /= s;
    if (pattern == RouterPattern::kNone) {
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + topk, order.end(),
                        [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    }
    for (int j = 0; j < topk; ++j) {
      const int e = pattern == RouterPattern::kNone ? order[static_cast<size_t>(j)]
                                                    : fixed_expert(pattern, token_offset + t, j, E, topk);
      r.expert[static_cast<size_t>(t * topk + j)] = e;
      r.weight[static_cast<size_t>(t * topk + j)] = p[e];
      ++r.counts[static_cast<size_t>(e)];
    }
    for (int e = 0; e < E; ++e) r.prob_sums[static_cast<size_t>(e)] += p[e];
  }
  if (capacity_factor > 0) {
    // Megatron's "probs" drop policy: per expert, keep the `cap` slots of highest probability.
    const int64_t cap = expert_capacity(T, topk, E, capacity_factor);
    std::vector<std::vector<int64_t>> slots(static_cast<size_t>(E));
    for (int64_t s = 0; s < T * topk; ++s) slots[static_cast<size_t>(r.expert[static_cast<size_t>(s)])].push_back(s);
    for (auto& v : slots) {
      if (static_cast<int64_t>(v.size()) <= cap) continue;
      std::stable_sort(v.begin(), v.end(), [&](int64_t a, int64_t b) {
        return r.weight[static_cast<size_t>(a)] > r.weight[static_cast<size_t>(b)];
      });
      for (size_t i = static_cast<size_t>(cap); i < v.size(); ++i) {
        r.kept[static_cast<size_t>(v[i])] = 0;
        r.weight[static_cast<size_t>(v[i])] = 0;
      }
    }
  }
  return r;
}

void route_topk_backward(const Routing& r, std::span<const float> dweight, std::span<const float> dprobs_extra,
                         MatrixView dlogits) {
  const int64_t T = r.tokens;
  const int E = r.experts, K = r.topk;
  COC_ASSERT(dlogits.rows == T && dlogits.cols == E && static_cast<int64_t>(dweight.size()) == T * K &&
                 (dprobs_extra.empty() || static_cast<int64_t>(dprobs_extra.size()) == T * E),
             "route_topk_backward: {} tokens × {} experts, dweight {}, dprobs_extra {}, dlogits [{}, {}]", T, E,
             dweight.size(), dprobs_extra.size(), dlogits.rows, dlogits.cols);
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "router_topk_backward", {"tokens", T});
  std::vector<float> dp(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) dp[static_cast<size_t>(e)] = dprobs_extra.empty() ? 0.0f : dprobs_extra[t * E + e];
    for (int j = 0; j < K; ++j)
      if (r.kept[static_cast<size_t>(t * K + j)])
        dp[static_cast<size_t>(r.expert[static_cast<size_t>(t * K + j)])] += dweight[t * K + j];
    const float* p = r.probs.data() + t * E;
    float dot = 0;
    for (int e = 0; e < E; ++e) dot += p[e] * dp[static_cast<size_t>(e)];
    float* d = dlogits.row(t);
    for (int e = 0; e < E; ++e) d[e] = p[e] * (dp[static_cast<size_t>(e)] - dot);
  }
}

double aux_loss_value(std::span<const int64_t> counts, std::span<const double> prob_sums, int64_t global_tokens,
                      int topk, double coeff) {
  COC_ASSERT(counts.size() == prob_sums.size(), "aux_loss_value: {} counts, {} prob sums", counts.size(),
             prob_sums.size());
  if (global_tokens == 0) return 0.0;
  const double E = static_cast<double>(counts.size()), T = static_cast<double>(global_tokens);
  double s = 0;
  for (size_t e = 0; e < counts.size(); ++e) s += static_cast<double>(counts[e]) / (T * topk) * (prob_sums[e] / T);
  return coeff * E * s;
}

void aux_loss_backward(std::span<const int64_t> counts, int64_t global_tokens, int topk, double coeff, double scale,
                       MatrixView dprobs) {
  COC_ASSERT(dprobs.cols == static_cast<int64_t>(counts.size()), "aux_loss_backward: {} counts, dprobs [{}, {}]",
             counts.size(), dprobs.rows, dprobs.cols);
  if (global_tokens == 0 || coeff == 0) return;
  const double E = static_cast<double>(counts.size()), T = static_cast<double>(global_tokens);
  std::vector<float> g(counts.size());
  for (size_t e = 0; e < counts.size(); ++e)
    g[e] = static_cast<float>(scale * coeff * E * (static_cast<double>(counts[e]) / (T * topk)) / T);
  for (int64_t t = 0; t < dprobs.rows; ++t)
    for (int64_t e = 0; e < dprobs.cols; ++e) dprobs.row(t)[e] += g[static_cast<size_t>(e)];
}

}  // namespace coc
