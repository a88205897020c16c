#include "coc/kernels/gemm.h"

#include <cblas.h>

#include <algorithm>

#include "coc/core/error.h"
#include "coc/runtime/tracer.h"

namespace coc {

const char* to_string(WeightLayout l) { return l == WeightLayout::kNK ? "[n,k]" : "[k,n]"; }

void gemm(ConstMatrixView a, bool trans_a, ConstMatrixView b, bool trans_b, MatrixView c, float alpha, float beta) {
  const int64_t m = trans_a ? a.cols : a.rows;
  const int64_t k = trans_a ? a.rows : a.cols;
  const int64_t kb = trans_b ? b.cols : b.rows;
  const int64_t n = trans_b ? b.rows : b.cols;
  COC_ASSERT(k == kb && c.rows == m && c.cols == n, "gemm shapes: op(a) [{}, {}], op(b) [{}, {}], c [{}, {}]", m, k,
             kb, n, c.rows, c.cols);
  if (m == 0 || n == 0) return;
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "gemm", {"m", m}, {"k", k}, {"n", n},
                  {"flop", 2 * m * n * k});
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c.row(i)[j] = beta == 0.0f ? 0.0f : beta * c.row(i)[j];
    return;
  }
  // cblas rejects ld < 1 even for untouched operands; a 1-row view may carry ld = 0.
  auto ld = [](int64_t v, int64_t cols) { return static_cast<blasint>(std::max<int64_t>({v, cols, 1})); };
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a.data,
              ld(a.ld, a.cols), b.data, ld(b.ld, b.cols), beta, c.data, ld(c.ld, c.cols));
}

void matmul(ConstMatrixView x, ConstMatrixView w, WeightLayout layout, MatrixView y, bool accumulate) {
  gemm(x, false, w, layout == WeightLayout::kNK, y, 1.0f, accumulate ? 1.0f : 0.0f);
}

void add_bias(MatrixView y, const float* bias) {
  for (int64_t i = 0; i < y.rows; ++i) {
    float* r = y.row(i);
    for (int64_t j = 0; j < y.cols; ++j) r[j] += bias[j];
  }
}

void accumulate_colsum(ConstMatrixView x, float* out) {
  for (int64_t i = 0; i < x.rows; ++i) {
    const float* r = x.row(i);
    for (int64_t j = 0; j < x.cols; ++j) out[j] += r[j];
  }
}

int set_blas_threads(int n) {
  openblas_set_num_threads(n);
  return openblas_get_num_threads();
}
int blas_threads() { return openblas_get_num_threads(); }
std::string blas_config() { return openblas_get_config(); }

}  // namespace coc
