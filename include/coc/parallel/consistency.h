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
  double rel() const { return abs / scale; }
};

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
