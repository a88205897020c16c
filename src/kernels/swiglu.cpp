// SwiGLU (Shazeer 2020): out = silu(gate) ⊙ up, as in LLaMA's FFN and Megatron's `swiglu`
// (megatron/core/fusions/fused_bias_swiglu.py).
#include <cmath>

#include "coc/core/error.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/runtime/tracer.h"

namespace coc {

namespace {
// 1/(1+e^(−g)) is stable for all g in fp32: e^(−g) overflows to inf for g < −88 and the result is then exactly 0.
inline float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }
}  // namespace

void swiglu_forward(ConstMatrixView gate, ConstMatrixView up, MatrixView out) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel1, "swiglu_forward", {"m", out.rows}, {"n", out.cols});
  COC_ASSERT(up.rows == gate.rows && up.cols == gate.cols && out.rows == gate.rows && out.cols == gate.cols,
             "swiglu_forward: gate [{}, {}], up [{}, {}], out [{}, {}]", gate.rows, gate.cols, up.rows, up.cols,
             out.rows, out.cols);
  for (int64_t i = 0; i < gate.rows; ++i) {
    const float* g = gate.row(i);
    const float* u = up.row(i);
    float* o = out.row(i);
    for (int64_t j = 0; j < gate.cols; ++j) o[j] = g[j] * sigmoid(g[j]) * u[j];
  }
}

void swiglu_backward(ConstMatrixView gate, ConstMatrixView up, ConstMatrixView dout, MatrixView dgate, MatrixView dup) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel1, "swiglu_backward", {"m", dout.rows}, {"n", dout.cols});
  COC_ASSERT(up.rows == gate.rows && up.cols == gate.cols && dout.rows == gate.rows && dout.cols == gate.cols &&
                 dgate.rows == gate.rows && dgate.cols == gate.cols && dup.rows == gate.rows && dup.cols == gate.cols,
             "swiglu_backward: gate [{}, {}], up [{}, {}], dout [{}, {}], dgate [{}, {}], dup [{}, {}]", gate.rows,
             gate.cols, up.rows, up.cols, dout.rows, dout.cols, dgate.rows, dgate.cols, dup.rows, dup.cols);
  for (int64_t i = 0; i < gate.rows; ++i) {
    const float* g = gate.row(i);
    const float* u = up.row(i);
    const float* d = dout.row(i);
    float* dg = dgate.row(i);
    float* du = dup.row(i);
    for (int64_t j = 0; j < gate.cols; ++j) {
      // Read everything first so that dgate or dup may alias dout.
      const float gj = g[j], uj = u[j], dj = d[j];
      const float s = sigmoid(gj);
      // d silu/dg = σ + g·σ·(1−σ) = σ·(1 + g·(1−σ)).
      dg[j] = dj * uj * s * (1.0f + gj * (1.0f - s));
      du[j] = dj * gj * s;
    }
  }
}

}  // namespace coc
