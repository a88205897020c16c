// DenseHead: a dense copy of one attention head's rows, for the attention kernels (attention.cpp,
// block_attention.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "coc/core/tensor.h"

namespace coc {

/// A dense [S, D] fp32 copy of rows of one head's S×D block (row t at t·D), its buffer reused across the heads of a
/// call. Why: a head block is a strided view (ld = B·heads·D), and oneDNN packs a strided operand on every GEMM
/// (gemm_onednn.cpp's densify), so the causal query blocks would copy the same keys once per block; one copy per head
/// and call hands the kernels the same dense operands, hence the same bits.
class DenseHead {
 public:
  /// A view whose rows [r0, r1) hold h's (the others are not set).
  MatrixView load(ConstMatrixView h, int64_t r0, int64_t r1) {
    const MatrixView d = rows(h.rows, h.cols);
    for (int64_t t = r0; t < r1; ++t) std::copy(h.row(t), h.row(t) + h.cols, d.row(t));
    return d;
  }
  /// An [S, D] view the caller fills.
  MatrixView rows(int64_t S, int64_t D) {
    if (buf_.size() < static_cast<size_t>(S * D)) buf_.resize(static_cast<size_t>(S * D));
    view_ = {buf_.data(), S, D, D};
    return view_;
  }
  /// Rows [r0, r1) of the last view back into h.
  void store(MatrixView h, int64_t r0, int64_t r1) const {
    for (int64_t t = r0; t < r1; ++t) std::copy(view_.row(t), view_.row(t) + view_.cols, h.row(t));
  }

 private:
  std::vector<float> buf_;
  MatrixView view_{};
};

}  // namespace coc
