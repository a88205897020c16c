// Consistency checks of the overlapped ops and layers against an fp64 single-rank reference: the engine of
// `coc check --op/--layer` and of the layer tests. Every rank generates the same full-size data from fixed seeds
// (uniform in [-1, 1): well-conditioned), takes its shard, runs the parallel path, and compares its part of the
// result with the fp64 reference of the whole problem.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coc/comm/communicator.h"
#include "coc/overlap/coc_ops.h"
#include "coc/parallel/context.h"

namespace coc {

/// Largest absolute error and largest reference magnitude seen; rel() = abs / scale.
struct ErrorStat {
  double abs = 0, scale = 1e-30;
  void add(float got, double ref);
  /// Records |got - ref| / bound instead (scale stays 1, so rel() is the worst ratio; <= 1 is within the bound).
  void add_bounded(float got, double ref, double bound);
  double rel() const { return abs / scale; }
};

/// The per-element error bound of a CoC op under --bf16 against the fp64 product of the bf16-ROUNDED inputs (so the
/// bf16 GEMM operands add nothing): s = Σ_p |a_ip·w_pj| over the whole k, u = 2^-8 (bf16's unit roundoff), T ranks.
///  - fp32 accumulation of the GEMMs and of the cross-rank sum (Higham, Accuracy and Stability, §3.1):
///    γ_{k+T}·s with γ_j = j·2^-24 / (1 - j·2^-24);
///  - the T bf16 partials, each rounded once (|p_r| <= s_r, Σ_r s_r = s): u·s; MPI's 16-bit sum in the
///    non-deterministic collective schedules rounds up to T - 1 intermediate sums, each <= s: (T - 1)·u·s;
///  - the all-gather's rounding of a (a no-op on rounded inputs, counted for unrounded ones): u·s;
///  - the sum rounded once to bf16: u·|ref|.
/// Returns 1.01·(u·|ref| + (T + 1)·u·s + γ_{k+T}·s) + 1e-30 (the 1.01 covers the second-order terms; the bias is added
/// in fp32 after the rounding, exactly enough to leave out).
double bf16_op_bound(double ref, double abs_sum, int64_t k, int T);

struct ConsistencyCase {
  std::string op;     ///< "matmul_all_reduce" | "matmul_reduce_scatter" | "all_gather_matmul" | "all_gather_matmul_v2"
  std::string layer;  ///< "column" | "row" (used when op is empty)
  int64_t m = 1, k = 1, n = 1;
  WeightLayout layout = WeightLayout::kNK;  ///< ops only; layers use Megatron's [n, k]
  bool bias = false;
  bool sequence_parallel = false;  ///< layers only
  bool input_is_parallel = true;   ///< row layer only
  bool fused_kernel = false;       ///< layers only: ParallelContext::fused_kernel (--coc-fused-kernel)
  bool mc2 = false;                ///< layers only: ParallelContext::mc2 (--use-mc2)
  bool frozen_weight = false;      ///< layers only: weight.requires_grad = false (no dW/db checked)
  bool tp_comm_bulk_wgrad = true;  ///< layers only: ParallelContext::tp_comm_bulk_wgrad
  bool delay_wgrad_compute = true; ///< layers only: ParallelContext::delay_wgrad_compute
  CocOptions coc;
  /// coc check --op OP / --layer column|row --bf16: the inputs (A or X, W, the bias, dY) are rounded to bf16 first,
  /// the op or layer moves bf16 (comm_dtype) and each result is checked against bf16_op_bound with the length of
  /// its own sum ("output / bf16 bound", "forward Y / bf16 bound", ...; <= 1 passes). The caller sets the GEMM
  /// compute type (set_gemm_compute_type).
  bool bf16 = false;
  uint64_t seed = 7;
  /// The layer modes' overlap flags (sequence_parallel, coc's N, algorithm and determinism, the fused modes), for
  /// make_parallel_context: the layers get their context the way coc train's do.
  OverlapConfig overlap() const {
    OverlapConfig f;
    f.sequence_parallel = sequence_parallel;
    f.coc_parallel_num = coc.parallel_num;
    f.coc_comm_algo = coc.comm_algo;
    f.deterministic = coc.deterministic;
    f.coc_min_chunk_rows = coc.min_chunk_rows;
    f.coc_fused_kernel = fused_kernel;
    f.use_mc2 = mc2;
    f.tp_comm_bulk_wgrad = tp_comm_bulk_wgrad;
    f.delay_wgrad_compute = delay_wgrad_compute;
    return f;
  }
};

/// Named error statistics of one check on this rank ("output", "gathered", "forward Y", "backward dX", ...).
using ConsistencyResult = std::vector<std::pair<std::string, ErrorStat>>;

/// Runs the case over `tp` (collective) and returns this rank's errors. Throws uniform kInvalidArgument for an
/// unknown op/layer or shapes < 1.
ConsistencyResult check_consistency(Communicator& tp, const ConsistencyCase& c);

/// The checks' input data: n floats uniform in [-1, 1) from std::mt19937_64(seed). Every check (and every rank)
/// draws the full tensors with the same seeds, then takes its shard, so all checks of a case see one problem.
std::vector<float> consistency_data(int64_t n, uint64_t seed);

}  // namespace coc
