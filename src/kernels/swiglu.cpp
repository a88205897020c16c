// SwiGLU (Shazeer 2020): out = silu(gate) ⊙ up, as in LLaMA's FFN and Megatron's `swiglu`
// (megatron/core/fusions/fused_bias_swiglu.py).
#include <cmath>
#include <vector>

#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/runtime/tracer.h"
#include "vec_math.h"

namespace coc {

namespace {
/// e[j] = 1/(1 + e^(−g[j])), the sigmoid, for one row. In its own loop: fast_exp's clamped arms then only reach a
/// store, not the products that follow in the callers (vec_math.h: computed per arm, those turned into subnormals
/// and ran 7x slower). 1/(1+e^(−g)) is stable for all g in fp32: fast_exp saturates at ~1.65e38 for g < −88, giving
/// ~6e-39 there instead of 0.
COC_VEC_CLONES void sigmoid_row(const float* g, float* e, int64_t n) {
  for (int64_t j = 0; j < n; ++j) e[j] = detail::fast_exp(-g[j]);
  for (int64_t j = 0; j < n; ++j) e[j] = 1.0f / (1.0f + e[j]);
}
}  // namespace

void swiglu_forward(ConstMatrixView gate, ConstMatrixView up, MatrixView out, MatrixViewT<BFloat16> out16) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "swiglu_forward", {"m", out.rows}, {"n", out.cols});
  COC_ASSERT(up.rows == gate.rows && up.cols == gate.cols && out.rows == gate.rows && out.cols == gate.cols &&
                 (out16.data == nullptr || (out16.rows == gate.rows && out16.cols == gate.cols)),
             "swiglu_forward: gate [{}, {}], up [{}, {}], out [{}, {}], bf16 out [{}, {}]", gate.rows, gate.cols,
             up.rows, up.cols, out.rows, out.cols, out16.rows, out16.cols);
  std::vector<float> sig(static_cast<size_t>(gate.cols));
  for (int64_t i = 0; i < gate.rows; ++i) {
    const float* g = gate.row(i);
    const float* u = up.row(i);
    float* o = out.row(i);
    sigmoid_row(g, sig.data(), gate.cols);
    for (int64_t j = 0; j < gate.cols; ++j) o[j] = g[j] * sig[static_cast<size_t>(j)] * u[j];
    if (out16.data) fp32_to_bf16(o, out16.row(i), gate.cols);
  }
}

void swiglu_backward(ConstMatrixView gate, ConstMatrixView up, ConstMatrixView dout, MatrixView dgate, MatrixView dup,
                     MatrixViewT<BFloat16> dgate16, MatrixViewT<BFloat16> dup16) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "swiglu_backward", {"m", dout.rows}, {"n", dout.cols});
  COC_ASSERT(up.rows == gate.rows && up.cols == gate.cols && dout.rows == gate.rows && dout.cols == gate.cols &&
                 dgate.rows == gate.rows && dgate.cols == gate.cols && dup.rows == gate.rows && dup.cols == gate.cols,
             "swiglu_backward: gate [{}, {}], up [{}, {}], dout [{}, {}], dgate [{}, {}], dup [{}, {}]", gate.rows,
             gate.cols, up.rows, up.cols, dout.rows, dout.cols, dgate.rows, dgate.cols, dup.rows, dup.cols);
  const bool to16 = dgate16.data != nullptr;
  COC_ASSERT(to16 == (dup16.data != nullptr) &&
                 (!to16 || (dgate16.rows == gate.rows && dgate16.cols == gate.cols && dup16.rows == gate.rows &&
                            dup16.cols == gate.cols)),
             "swiglu_backward: bf16 dgate [{}, {}], dup [{}, {}] for [{}, {}]", dgate16.rows, dgate16.cols,
             dup16.rows, dup16.cols, gate.rows, gate.cols);
  std::vector<float> sig(static_cast<size_t>(gate.cols));
  for (int64_t i = 0; i < gate.rows; ++i) {
    const float* g = gate.row(i);
    const float* u = up.row(i);
    const float* d = dout.row(i);
    float* dg = dgate.row(i);
    float* du = dup.row(i);
    sigmoid_row(g, sig.data(), gate.cols);
    for (int64_t j = 0; j < gate.cols; ++j) {
      // Read everything first so that dgate or dup may alias dout.
      const float gj = g[j], uj = u[j], dj = d[j];
      const float s = sig[static_cast<size_t>(j)];
      // d silu/dg = σ + g·σ·(1−σ) = σ·(1 + g·(1−σ)).
      dg[j] = dj * uj * s * (1.0f + gj * (1.0f - s));
      du[j] = dj * gj * s;
    }
    if (to16) {
      fp32_to_bf16(dg, dgate16.row(i), gate.cols);
      fp32_to_bf16(du, dup16.row(i), gate.cols);
    }
  }
}

}  // namespace coc
