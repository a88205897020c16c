// RMSNorm forward/backward (Zhang & Sennrich 2019), llm.c-style. See transformer_ops.h for shapes.
// Built with vec_math.h's flags (CMakeLists.txt): its fp64 row sums keep fixed lanes, so the bits do not depend on
// the CPU's vector width.
#include <cmath>

#include "coc/core/error.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/runtime/tracer.h"
#include "vec_math.h"

namespace coc {

COC_VEC_CLONES void rmsnorm_forward(ConstMatrixView x, const float* w, float eps, MatrixView y, float* rstd) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "rmsnorm_forward", {"m", x.rows}, {"n", x.cols});
  COC_ASSERT(y.rows == x.rows && y.cols == x.cols, "rmsnorm_forward: x [{}, {}], y [{}, {}]", x.rows, x.cols, y.rows,
             y.cols);
  COC_ASSERT(eps > 0.0f, "rmsnorm_forward: eps {} must be > 0", eps);
  const int64_t h = x.cols;
  for (int64_t i = 0; i < x.rows; ++i) {
    const float* xr = x.row(i);
    // The mean of squares is summed in fp64: H is up to ~8k and the statistic feeds every output of the row,
    // so its rounding error is worth the (negligible, O(H)) cost.
    const double ss = detail::row_dot_f64(xr, xr, nullptr, h);
    const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(h > 0 ? h : 1) + eps));
    rstd[i] = r;
    float* yr = y.row(i);
    for (int64_t j = 0; j < h; ++j) yr[j] = xr[j] * r * w[j];
  }
}

COC_VEC_CLONES void rmsnorm_backward(ConstMatrixView x, const float* w, const float* rstd, ConstMatrixView dy, MatrixView dx,
                      float* dw, bool accumulate_dx) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "rmsnorm_backward", {"m", x.rows}, {"n", x.cols});
  COC_ASSERT(dy.rows == x.rows && dy.cols == x.cols && dx.rows == x.rows && dx.cols == x.cols,
             "rmsnorm_backward: x [{}, {}], dy [{}, {}], dx [{}, {}]", x.rows, x.cols, dy.rows, dy.cols, dx.rows,
             dx.cols);
  const int64_t h = x.cols;
  for (int64_t i = 0; i < x.rows; ++i) {
    const float* xr = x.row(i);
    const float* dyr = dy.row(i);
    float* dxr = dx.row(i);
    const float r = rstd[i];
    // y_j = x_j·r·w_j with r = (mean(x²)+eps)^(-1/2), so ∂r/∂x_k = −r³·x_k/H and
    // dx_k = r·g_k − x_k·r³·mean(g ⊙ x), g = dy ⊙ w. The reduction must finish before any dx is written.
    const double gx = detail::row_dot_f64(dyr, w, xr, h);
    const float c = static_cast<float>(gx / static_cast<double>(h > 0 ? h : 1)) * r * r;
    for (int64_t j = 0; j < h; ++j) {
      const float d = r * (dyr[j] * w[j] - xr[j] * c);
      dxr[j] = accumulate_dx ? dxr[j] + d : d;
    }
    for (int64_t j = 0; j < h; ++j) dw[j] += dyr[j] * xr[j] * r;
  }
}

}  // namespace coc
