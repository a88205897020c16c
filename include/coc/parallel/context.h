// What every tensor-parallel layer needs to know at call time: its TP communicator, whether sequence
// parallelism is on, and the CoC options (N, determinism, stats).
#pragma once

#include "coc/comm/communicator.h"
#include "coc/overlap/coc_ops.h"

namespace coc {

struct ParallelContext {
  Communicator* tp = nullptr;     ///< the TP group (size T); not owned
  bool sequence_parallel = false; ///< --sequence-parallel: activations outside TP regions are split along rows
  CocOptions coc;                 ///< --coc-parallel-num etc.; coc.tag is overwritten per layer call
  int tp_size() const { return tp->size(); }
  int tp_rank() const { return tp->rank(); }
  /// Rows of the sequence-parallel shard of this rank when the full activation has m rows.
  int64_t shard_rows(int64_t m) const;
  /// Rows this rank holds outside TP regions: shard_rows(m) with SP, m without.
  int64_t local_rows(int64_t m) const { return sequence_parallel ? shard_rows(m) : m; }
};

}  // namespace coc
