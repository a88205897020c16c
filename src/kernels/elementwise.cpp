// Elementwise helpers on (possibly strided) matrix views.
#include <algorithm>

#include "coc/core/error.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/runtime/tracer.h"

namespace coc {

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
  for (int64_t i = 0; i < y.rows; ++i) {
    float* yr = y.row(i);
    const float* xr = x.row(i);
    for (int64_t j = 0; j < y.cols; ++j) yr[j] += xr[j];
  }
}

void copy(ConstMatrixView x, MatrixView y) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "copy", {"m", y.rows}, {"n", y.cols});
  COC_ASSERT(y.rows == x.rows && y.cols == x.cols, "copy: x [{}, {}], y [{}, {}]", x.rows, x.cols, y.rows, y.cols);
  if (x.data == y.data && x.ld == y.ld) return;  // identical views: nothing to do
  for (int64_t i = 0; i < y.rows; ++i) std::copy_n(x.row(i), x.cols, y.row(i));
}

}  // namespace coc
