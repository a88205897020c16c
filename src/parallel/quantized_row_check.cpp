// check_w8a16_row_layer (quantized_row_linear.h): `coc check --layer row --w8a16 SPEC`. The reference is the fp64
// product with the dequantised weights, so it measures the overlap pipeline and the panel GEMM, not the
// quantisation error (which is bounded by scale/2 per element, tests/kernels/test_quant.cpp).
#include <optional>
#include <random>

#include "coc/core/error.h"
#include "coc/overlap/partition.h"
#include "coc/parallel/consistency.h"
#include "coc/parallel/quantized_row_linear.h"

namespace coc {

W8a16CheckResult check_w8a16_row_layer(Communicator& tp, const ConsistencyCase& c, const QuantSpec& spec,
                                       bool asymmetric) {
  const int64_t m = c.m, k = c.k, n = c.n;
  if (m < 1 || k < 1 || n < 1) throw_invalid("coc check --w8a16: --m, --k, --n must be >= 1 (got {}, {}, {})", m, k, n);
  const int T = tp.size();
  const auto X = consistency_data(m * k, c.seed), W = consistency_data(k * n, c.seed + 1),
             B = consistency_data(n, c.seed + 2);
  const ParallelContext ctx{.tp = &tp, .sequence_parallel = c.sequence_parallel, .coc = c.coc};
  const RowRange ks = split_rows(k, T, tp.rank());
  W8a16CheckResult res;
  // The reference: Σ over ranks of X[:, k_r] · dequantize(quantize(W[:, k_r])), each rank's slice rebuilt here.
  std::vector<double> ref(static_cast<size_t>(m * n), 0.0);
  std::optional<QuantizedRowParallelLinear> mine;
  // Every rank checks every slice first: k may split unevenly, and a rank alone refusing its slice would leave
  // the others waiting in the all-reduce.
  for (int r = 0; r < T; ++r)
    if (spec.granularity == QuantGranularity::kPerGroup && spec.group >= split_rows(k, T, r).count)
      throw_invalid("coc check --w8a16 {}: the group size must be less than every rank's k slice (rank {} holds {} "
                    "of k={}); use a larger --k or a smaller group",
                    spec.str(), r, split_rows(k, T, r).count, k);
  for (int r = 0; r < T; ++r) {
    const RowRange kr = split_rows(k, T, r);
    Tensor wr({n, kr.count});
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < kr.count; ++p) wr[j * kr.count + p] = W[static_cast<size_t>(j * k + kr.begin + p)];
    if (r == tp.rank()) {
      // This rank's fp32 row layer, quantised into the frozen w8a16 layer under test.
      RowParallelLinear fp("check.row", k, n, &ctx, {.bias = c.bias});
      fp.weight.value = wr;
      if (c.bias) std::copy(B.begin(), B.end(), fp.bias.value.data());
      mine.emplace(fp, spec, &ctx, QuantizedRowParallelLinear::Options{.asymmetric = asymmetric});
      res.fp32_bytes = mine->fp32_weight_bytes();
      res.int8_bytes = mine->weight_bytes();
    }
    const Tensor wd = dequantize(quantize_weight(wr.mat(), WeightLayout::kNK, spec, asymmetric));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < kr.count; ++p) {
        const double x = X[static_cast<size_t>(i * k + kr.begin + p)];
        const float* wrow = wd.mat().row(p);
        double* yr = ref.data() + i * n;
        for (int64_t j = 0; j < n; ++j) yr[j] += x * wrow[j];
      }
  }
  Tensor xl({m, ks.count}), y({m, n});
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < ks.count; ++p) xl[i * ks.count + p] = X[static_cast<size_t>(i * k + ks.begin + p)];
  mine->forward(ActivationView::f32(xl.mat()), y.mat());
  ErrorStat e;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      e.add(y[i * n + j], ref[static_cast<size_t>(i * n + j)] + (c.bias ? B[static_cast<size_t>(j)] : 0.0));
  res.errors.emplace_back("forward Y (w8a16)", e);
  return res;
}

}  // namespace coc
