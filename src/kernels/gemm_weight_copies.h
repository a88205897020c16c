// The lookup halves of GemmWeightCopies and GemmOperandCopy (coc/kernels/gemm.h), for gemm.cpp.
#pragma once

#include <optional>

#include "coc/kernels/gemm.h"

namespace coc::detail {

/// x as bf16 when it lies inside a weight of the live GemmWeightCopies: a view of the same shape and leading
/// dimension into that weight's bf16 copy (rounded on first use). nullopt when no instance is alive, x is empty, or
/// x is not inside one weight. Thread-safe.
std::optional<MatrixViewT<const BFloat16>> weight_copy_bf16(ConstMatrixView x);

/// x as bf16 when it lies inside the activation of a live GemmOperandCopy of this thread (the innermost that holds
/// it), rounded on first use; nullopt otherwise.
std::optional<MatrixViewT<const BFloat16>> operand_copy_bf16(ConstMatrixView x);

}  // namespace coc::detail
