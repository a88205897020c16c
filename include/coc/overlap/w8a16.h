// w8a16 matmul_all_reduce: out = AR_T(a · dequantize(w_int8)) + bias, the weight-only-quantised row-parallel
// forward of torch_npu's npu_mm_all_reduce_base with antiquant_scale / antiquant_offset / antiquant_group_size
// (MindSpeed's fused matmul_all_reduce, docs/semantics.md §3 "w8a16 for matmul_all_reduce").
//
// Shapes: a [m, k] activations of this rank's k-slice, fp32, fp16 or bf16 (ActivationView); w an Int8Weight [k, n]
// with per-tensor [1], per-channel [n] or per-group [ceil(k/g), n] scales (quant.h); out [m, n] fp32, the full
// reduced result on every rank; bias n floats or nullptr, added once after the reduction. Same m and n on every
// rank; k may differ.
//
// Schedule: the chunked compute-first pipeline of matmul_all_reduce (coc_ops.h): chunk c's rows are computed by
// the panel GEMM (matmul_w8: each k-panel of the weight dequantised into a cache-sized scratch, then sgemm), then
// their all-reduce is posted in place while chunk c+1 computes. Deterministic mode (CocOptions::deterministic)
// is that of the fp32 op (docs/design.md, "Deterministic mode").
// With CocOptions::fused the weight is dequantised to fp32 once for the call and the fused shared-memory
// matmul_all_reduce runs (its GEMM tiles need an fp32 operand); that costs the fp32 weight's memory transiently.
//
// Errors: a uniform kInvalidArgument naming the op, rank and shapes for a bad activation dtype (int8),
// mismatched k, n or out shape, a malformed Int8Weight (scale/offset shape, group size), or bad options;
// kTimeout/kComm from the collectives.
#pragma once

#include "coc/kernels/quant.h"
#include "coc/overlap/coc_ops.h"

namespace coc {

/// Asynchronous form: returns with the all-reduces possibly in flight; wait() before reading `out` or freeing
/// `a`/`w`.
CocPending w8a16_matmul_all_reduce_async(Communicator& group, ActivationView a, const Int8Weight& w, MatrixView out,
                                         const float* bias, const CocOptions& opts, const W8GemmOptions& gemm = {});
/// Blocking form.
void w8a16_matmul_all_reduce(Communicator& group, ActivationView a, const Int8Weight& w, MatrixView out,
                             const float* bias, const CocOptions& opts, const W8GemmOptions& gemm = {});

}  // namespace coc
