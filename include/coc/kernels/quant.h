// w8a16 weights: int8 weight, fp32 scale and optional offset, dequantised as w = (w_int8 + offset) · scale, and
// the GEMM y = x · w with x in fp32 or fp16. This is torch_npu's npu_mm_all_reduce_base "antiquant" contract
// (antiquant_scale / antiquant_offset / antiquant_group_size; docs/semantics.md §3), for CPUs: activations may be fp16
// (converted with F16C, fp16.h) or fp32, and all arithmetic is fp32 (no 16-bit math on the target CPUs).
//
// Shapes: the quantised weight is [k, n] (in-features × out-features, row-major: row p holds the n output
// columns of input feature p). Scale and offset:
//   per-tensor  [1]
//   per-channel [n]                one per output column
//   per-group   [ceil(k/g), n]     rows p of the weight use scale row p / g; the last group may be short
// g must be a positive multiple of 32 and less than k (torch_npu's rule). Offsets are optional (symmetric
// quantisation) and, when present, have the scale's shape.
//
// Memory: the weight costs k·n bytes plus 4 bytes per scale/offset element, about 4× less than fp32.
// Errors: bad shapes, group sizes or dtypes throw a uniform kInvalidArgument naming the field and the fix.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coc/core/bf16.h"
#include "coc/core/dtype.h"
#include "coc/core/tensor.h"
#include "coc/kernels/gemm.h"

namespace coc {


enum class QuantGranularity { kPerTensor, kPerChannel, kPerGroup };

/// How the scales are laid out. group is g for kPerGroup, 0 otherwise.
struct QuantSpec {
  QuantGranularity granularity = QuantGranularity::kPerChannel;
  int64_t group = 0;
  /// "per-tensor", "per-channel", "per-group:64".
  std::string str() const;
  /// Parses the --w8a16 value above. Throws a uniform kInvalidArgument for anything else (including a group
  /// size that is not a positive multiple of 32).
  static QuantSpec parse(const std::string& s);
  /// Rows of the scale/offset array for a weight with k input features: 1, 1 or ceil(k/g).
  int64_t scale_rows(int64_t k) const;
  /// Columns of the scale/offset array: 1 for per-tensor, n otherwise.
  int64_t scale_cols(int64_t n) const;
};

/// An int8 weight [k, n] with its scales (fp32) and optional offsets (fp32, same shape as the scales).
struct Int8Weight {
  int64_t k = 0, n = 0;
  QuantSpec spec;
  std::vector<int8_t> q;       ///< [k, n] row-major
  std::vector<float> scale;    ///< [scale_rows(k), scale_cols(n)]
  std::vector<float> offset;   ///< empty (symmetric) or the scale's shape
  /// Bytes held: k·n + 4·(scales + offsets).
  int64_t bytes() const;
  /// Throws a uniform kInvalidArgument naming `what` if any array has the wrong size or the group size is
  /// invalid for this k (g % 32 != 0, g <= 0, g >= k).
  void validate(const std::string& what) const;
};

/// Quantises an fp32 weight. `w` is [k, n] (kKN) or [n, k] (kNK, Megatron's [out, in], transposed here).
/// Symmetric: scale = max|w| / 127 over each scale's elements, q = round(w / scale) in [−127, 127], no offset.
/// Asymmetric: scale = (max − min) / 255, offset = min / scale + 128, q = round(w / scale − offset) in [−128, 127]
/// (so −128 maps to min). A constant group gets scale 1 (symmetric: 1 if it is all zero). The error per element
/// is at most scale / 2. Throws as validate() for a bad spec (group size) against this k.
Int8Weight quantize_weight(ConstMatrixView w, WeightLayout layout, const QuantSpec& spec, bool asymmetric);

/// out[i, j] = dequantised weight element (row0 + i, col0 + j): the block [out.rows, out.cols] of the [k, n]
/// weight at (row0, col0), in fp32. The block must lie inside the weight (kInternal otherwise).
void dequantize_block(const Int8Weight& w, int64_t row0, int64_t col0, MatrixView out);
/// The whole dequantised weight [k, n] (the reference the w8a16 GEMM is checked against).
Tensor dequantize(const Int8Weight& w);

/// An activation matrix [rows, cols] of dtype fp32, fp16 or bf16 (row-major, leading dimension ld in elements).
struct ActivationView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0, ld = 0;
  static ActivationView f32(ConstMatrixView v) { return {v.data, DType::kF32, v.rows, v.cols, v.ld}; }
  static ActivationView f16(const uint16_t* p, int64_t rows, int64_t cols, int64_t ld) {
    return {p, DType::kF16, rows, cols, ld};
  }
  static ActivationView bf16(const BFloat16* p, int64_t rows, int64_t cols, int64_t ld) {
    return {p, DType::kBF16, rows, cols, ld};
  }
  ActivationView slice_rows(int64_t begin, int64_t count) const;
};

/// dst[rows, cols] (dense) = x widened to fp32; exact for every dtype (fp16 and bf16 values are fp32 values).
/// The dequantised weight is multiplied in fp32 whatever x's type: this CPU's int8 and 16-bit paths do not meet.
void activation_to_f32(const ActivationView& x, float* dst);

/// How the int8-weight GEMM dequantises.
struct W8GemmOptions {
  /// Rows of the weight dequantised per panel; 0 = automatic (256 rows, about OpenBLAS's own k-block, so the
  /// extra passes over y cost little).
  int64_t panel_rows = 0;
  /// Columns per panel; 0 = automatic (as many as keep the panel within 1 MiB, L2-sized on Zen 3, and at least
  /// 64), so the scratch stays cache-sized even for n = 14336.
  int64_t panel_cols = 0;
  /// Dequantise the whole weight once per call instead (the simple baseline, k·n·4 bytes of scratch).
  bool dequantize_all = false;
};

/// y[m, n] = x[m, k] · dequantize(w) (+ y if accumulate). x fp32, fp16 or bf16 (16-bit x is widened to fp32 first).
/// Panel algorithm: for each block of panel_cols output columns, and within it each k-panel of panel_rows weight
/// rows, dequantise the [panel_rows, panel_cols] block into a cache-sized fp32 scratch and call the fp32 gemm() on
/// it, accumulating into y's column block (kept hot across the k-panels), so the full fp32 weight never exists.
/// FLOPs = 2·m·n·k.
/// Throws a uniform kInvalidArgument when w is malformed (Int8Weight::validate), x is not fp32/fp16, x.cols != w.k
/// or y is not [m, w.n].
void matmul_w8(ActivationView x, const Int8Weight& w, MatrixView y, bool accumulate = false,
               const W8GemmOptions& opts = {});

/// Empty when x is a computable activation for a weight of `k` inputs ([*, k], fp32/fp16/bf16, ld >= cols), else the
/// sentence to report.
std::string check_activation(const ActivationView& x, int64_t k);

}  // namespace coc
