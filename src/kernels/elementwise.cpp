// Elementwise helpers on (possibly strided) matrix views.
#include <algorithm>

#include "coc/core/error.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/runtime/tracer.h"
#include "vec_math.h"

namespace coc {

namespace {
/// y[j] += x[j] for j in [0, n). Its own cloned loop: at -O2 GCC left add_inplace scalar (it will not add the
/// aliasing check vectorising needs), 0.32 ns per element on a Zen 5 core against 0.08-0.14 vectorised; the
/// residual adds took 1.6 ms of a bf16 step at issue 35's shape (docs/performance.md point 54). Exact either way.
COC_VEC_CLONES void add_row(float* y, const float* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] += x[j];
}
}  // namespace

double sum_squares(const Tensor& t) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "sum_squares", {"n", t.numel()});
  double s = 0.0;
  const float* p = t.data();
  for (int64_t i = 0; i < t.numel(); ++i) s += static_cast<double>(p[i]) * p[i];
  return s;
}

void add_inplace(MatrixView y, ConstMatrixView x) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "add_inplace", {"m", y.rows}, {"n", y.cols});
  COC_ASSERT(y.rows == x.rows && y.cols == x.cols, "add_inplace: y [{}, {}], x [{}, {}]", y.rows, y.cols, x.rows,
             x.cols);
  if (y.ld == y.cols && x.ld == x.cols) return add_row(y.data, x.data, y.rows * y.cols);
  for (int64_t i = 0; i < y.rows; ++i) add_row(y.row(i), x.row(i), y.cols);
}

void copy(ConstMatrixView x, MatrixView y) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "copy", {"m", y.rows}, {"n", y.cols});
  COC_ASSERT(y.rows == x.rows && y.cols == x.cols, "copy: x [{}, {}], y [{}, {}]", x.rows, x.cols, y.rows, y.cols);
  if (x.data == y.data && x.ld == y.ld) return;  // identical views: nothing to do
  for (int64_t i = 0; i < y.rows; ++i) std::copy_n(x.row(i), x.cols, y.row(i));
}

}  // namespace coc
