// Single-rank fp32 GEMM through OpenBLAS (cblas_sgemm). 76–86 GFLOP/s on one Zen 3 core (docs/performance.md).
// One BLAS thread per rank: ranks are pinned, and BLAS threads × ranks > cores thrashes (edge case 16 of
// docs/edge-cases.md).
#pragma once

#include "coc/core/tensor.h"

namespace coc {

/// How a weight matrix is stored. Explicit, never inferred from shapes: inference goes wrong when k == n
/// (edge case 2; Ascend's MC2 API infers it).
enum class WeightLayout {
  kNK,  ///< [n, k] = [out, in], Megatron's layout: y = x·wᵀ
  kKN,  ///< [k, n] = [in, out]: y = x·w
};
const char* to_string(WeightLayout l);

/// c = alpha · op(a) · op(b) + beta · c, where op(x) = xᵀ if the flag is set.
/// Shapes: op(a) [m, k], op(b) [k, n], c [m, n]; FLOPs = 2·m·n·k. m, n or k may be 0 (then c is only scaled by
/// beta). Throws kInternal on mismatched shapes (callers validate user input first).
void gemm(ConstMatrixView a, bool trans_a, ConstMatrixView b, bool trans_b, MatrixView c, float alpha = 1.0f,
          float beta = 0.0f);

/// y = x · W (+ y if accumulate), where W is `w` read with `layout`: x [m, k], w [n, k] (kNK) or [k, n] (kKN),
/// y [m, n].
void matmul(ConstMatrixView x, ConstMatrixView w, WeightLayout layout, MatrixView y, bool accumulate = false);

/// The k and n of weight `w` under `layout`.
inline int64_t weight_k(ConstMatrixView w, WeightLayout l) { return l == WeightLayout::kNK ? w.cols : w.rows; }
inline int64_t weight_n(ConstMatrixView w, WeightLayout l) { return l == WeightLayout::kNK ? w.rows : w.cols; }

/// y[i, :] += bias[:] for every row. bias has y.cols entries.
void add_bias(MatrixView y, const float* bias);
/// out[j] += sum_i x[i, j] (bias gradient). out has x.cols entries.
void accumulate_colsum(ConstMatrixView x, float* out);

/// Sets the BLAS thread count for this process; returns what BLAS reports afterwards.
int set_blas_threads(int n);
int blas_threads();
/// BLAS build description, e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64".
std::string blas_config();

}  // namespace coc
