// QuantizedRowParallelLinear (quantized_row_linear.h): a frozen row-parallel layer whose forward is the w8a16
// matmul_all_reduce (overlap/w8a16.h).
#include <fmt/format.h>

#include "coc/core/error.h"
#include "coc/overlap/w8a16.h"
#include "coc/parallel/quantized_row_linear.h"

namespace coc {

QuantizedRowParallelLinear::QuantizedRowParallelLinear(const RowParallelLinear& src, const QuantSpec& spec,
                                                       const ParallelContext* ctx, Options options)
    : name_(src.weight.name.empty() ? "row" : src.weight.name), ctx_(ctx) {
  if (name_.size() > 7 && name_.ends_with(".weight")) name_.resize(name_.size() - 7);  // the layer's name
  if (ctx_->sequence_parallel)
    throw_invalid("{} --w8a16: only the row layer without --sequence-parallel is supported (w8a16 exists for "
                  "matmul_all_reduce only, as in torch_npu); drop --sequence-parallel or --w8a16",
                  name_);
  const ConstMatrixView w = src.weight.value.mat();
  if (spec.granularity == QuantGranularity::kPerGroup && spec.group >= w.cols)
    throw_invalid("{} --w8a16 {}: the group size must be less than this rank's k slice ({} of the layer's "
                  "in-features on tp rank {}); use a smaller group or per-channel",
                  name_, spec.str(), w.cols, ctx_->tp_rank());
  w_ = quantize_weight(w, WeightLayout::kNK, spec, options.asymmetric);
  if (src.bias.value.numel() > 0) bias_ = src.bias.value;
}

void QuantizedRowParallelLinear::forward(ActivationView x, MatrixView y) {
  CocOptions o = ctx_->coc;
  o.tag = name_ + " fwd (w8a16)";
  w8a16_matmul_all_reduce(*ctx_->tp, x, w_, y, bias_.numel() > 0 ? bias_.data() : nullptr, o);
}

}  // namespace coc
