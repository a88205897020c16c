// The operands of the attention kernels' products (attention.cpp, block_attention.cpp): a dense copy of one head's
// rows (DenseHeadT), and a block of probabilities or their gradient as an operand (as_operand), in fp32 or bf16.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "coc/core/bf16.h"
#include "coc/core/tensor.h"

namespace coc {

/// A dense [S, D] copy of rows of one head's S×D block (row t at t·D), in T (fp32, or bf16: the operands of
/// attention's bf16 products, transformer_ops.h), its buffer reused across the heads of a call. Why: a head block is
/// a strided view (ld = B·heads·D), and oneDNN packs a strided operand on every GEMM (gemm_onednn.cpp's densify), so
/// the causal query blocks would copy the same keys once per block; one copy per head and call hands the kernels
/// the same dense operands, hence the same bits.
template <typename T>
class DenseHeadT {
 public:
  /// A view whose rows [r0, r1) hold h's, converted to T (the others are not set).
  MatrixViewT<T> load(ConstMatrixView h, int64_t r0, int64_t r1) {
    const MatrixViewT<T> d = rows(h.rows, h.cols);
    if constexpr (std::is_same_v<T, float>) {
      for (int64_t t = r0; t < r1; ++t) std::copy(h.row(t), h.row(t) + h.cols, d.row(t));
    } else if (r1 > r0) {
      fp32_to_bf16_rows(h.row(r0), h.ld, d.row(r0), d.ld, r1 - r0, h.cols);
    }
    return d;
  }
  /// An [S, D] view the caller fills.
  MatrixViewT<T> rows(int64_t S, int64_t D) {
    if (buf_.size() < static_cast<size_t>(S * D)) buf_.resize(static_cast<size_t>(S * D));
    view_ = {buf_.data(), S, D, D};
    return view_;
  }
  /// Rows [r0, r1) of the last view back into h (fp32 only: the gradients attention accumulates).
  void store(MatrixView h, int64_t r0, int64_t r1) const requires std::is_same_v<T, float> {
    for (int64_t t = r0; t < r1; ++t) std::copy(view_.row(t), view_.row(t) + view_.cols, h.row(t));
  }

 private:
  std::vector<T> buf_;
  MatrixViewT<T> view_{};
};
using DenseHead = DenseHeadT<float>;

/// x as an operand of attention's products in T: itself in fp32; in bf16 a dense copy in `buf` (the probabilities
/// and their gradient, one query block or tile at a time; transformer_ops.h).
template <typename T>
MatrixViewT<const T> as_operand(ConstMatrixView x, std::vector<T>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    if (buf.size() < static_cast<size_t>(x.rows * x.cols)) buf.resize(static_cast<size_t>(x.rows * x.cols));
    for (int64_t i = 0; i < x.rows; ++i) fp32_to_bf16(x.row(i), buf.data() + i * x.cols, x.cols);
    return {buf.data(), x.rows, x.cols, x.cols};
  }
}

}  // namespace coc
