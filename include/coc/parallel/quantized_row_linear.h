// A frozen (inference-only) RowParallelLinear with a w8a16 weight (--w8a16 per-tensor|per-channel|per-group:G):
// the weight-only-quantised row layer of torch_npu's npu_mm_all_reduce_base / MindSpeed's fused
// matmul_all_reduce with antiquant (docs/semantics.md §3). Frozen: there is no backward and no gradient, so the fp32
// weight can be dropped after quantisation and the layer holds about 4× fewer weight bytes.
//
// Shapes (as RowParallelLinear, linear.h): full k → n; this rank holds the k-slice split_rows(k, T, r) of the
// input features. Input X [m, k_r] fp32 or fp16 (ActivationView); output Y [m, n] fp32, the full reduced result on
// every rank (sequence parallelism off: torch_npu has w8a16 only for matmul_all_reduce). Bias [n], replicated,
// added once after the reduction. The quantised weight is [k_r, n] (quant.h's layout), scales per quant.h.
//
// Errors: uniform kInvalidArgument naming the layer and shapes for mismatched inputs, an invalid QuantSpec for
// this rank's k_r (g must be a multiple of 32 below k_r), or sequence parallelism on (use the fp32 layer).
#pragma once

#include <string>

#include "coc/kernels/quant.h"
#include "coc/parallel/consistency.h"
#include "coc/parallel/context.h"
#include "coc/parallel/linear.h"

namespace coc {

/// QuantizedRowParallelLinear's options.
struct QuantizedRowParallelLinearOptions {
  bool asymmetric = false;  ///< int8 with a zero point per scale (quant.h's antiquant_offset); false: symmetric
};

class QuantizedRowParallelLinear {
 public:
  using Options = QuantizedRowParallelLinearOptions;
  /// Quantises `src`'s local weight [n, k_r] (and copies its bias); `src` may be destroyed afterwards. `ctx` (the
  /// group and CoC options, linear.h) must outlive the layer.
  QuantizedRowParallelLinear(const RowParallelLinear& src, const QuantSpec& spec, const ParallelContext* ctx,
                             Options options = {});
  /// y[m, n] = AR_T(x[m, k_r] · dequantize(W_r)) + bias.
  void forward(ActivationView x, MatrixView y);
  const Int8Weight& weight() const { return w_; }
  /// Bytes of this rank's quantised weight (int8 values, scales, offsets) and of the fp32 weight it replaces.
  int64_t weight_bytes() const { return w_.bytes(); }
  int64_t fp32_weight_bytes() const { return w_.k * w_.n * 4; }

 private:
  std::string name_;
  const ParallelContext* ctx_;
  Int8Weight w_;
  Tensor bias_;
};

/// `coc check --layer row --w8a16 SPEC`: the quantised row layer's forward against an fp64 reference computed
/// from the dequantised weights of every rank (Σ_r X[:, k_r] · dequantize(W_r) + b), with the data of
/// check_consistency (same seeds). Collective over `tp`. Returns this rank's "forward Y" error and the weight
/// bytes.
struct W8a16CheckResult {
  ConsistencyResult errors;
  int64_t fp32_bytes = 0, int8_bytes = 0;
};
W8a16CheckResult check_w8a16_row_layer(Communicator& tp, const ConsistencyCase& c, const QuantSpec& spec,
                                       bool asymmetric);

}  // namespace coc
