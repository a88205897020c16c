// What every tensor-parallel layer is given at construction (linear.h, vocab_parallel.h): the group its ops run on,
// whether sequence parallelism is on, and the CoC options (N, determinism, stats). The caller builds the context
// and injects the group, as Megatron-core passes tp_group to its layers; the layers keep the pointer and read the
// context at call time, so it must outlive them.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "coc/comm/communicator.h"
#include "coc/overlap/coc_ops.h"

namespace coc {

struct ParallelContext {
  /// The group the layers' CoC ops and collectives run on: the TP group (size T); not owned.
  Communicator* tp = nullptr;
  bool sequence_parallel = false; ///< --sequence-parallel: activations outside TP regions are split along rows
  CocOptions coc;                 ///< --coc-parallel-num etc.; coc.tag and coc.fused are set per layer call
  /// --coc-fused-kernel: every TP op that docs/semantics.md §1-2 would chunk runs the fused node-shared kernel
  /// (fused_ops.h) instead: column fwd AG, column bwd AR/RS, row fwd AR/RS, row bwd AG.
  bool fused_kernel = false;
  /// --use-mc2 (needs sequence_parallel): MC2's placement (docs/semantics.md §3): column forward all_gather_matmul,
  /// row forward matmul_reduce_scatter and row backward all_gather_matmul_v2 run fused; the column backward stays
  /// the chunked overlap (its RS tail hides the dW GEMM), except for a frozen weight (no wgrad), whose dX
  /// matmul_reduce_scatter runs fused.
  bool mc2 = false;
  /// --tp-comm-bulk-wgrad (Megatron's and TransformerEngine's name for the same overlap; docs/semantics.md §2): the
  /// column layer's backward keeps its dX reduction (all-reduce, or reduce-scatter with SP) in flight while its
  /// weight-gradient GEMM (and the delayed ones below) run, with the progress engine polling meanwhile
  /// (ProgressEngine::poll_during). Under --coc-parallel-num auto or 1 the reduction is one non-blocking
  /// collective after the whole dX GEMM (TransformerEngine's "bulk" overlap: the dW GEMM, as long as the dX GEMM,
  /// hides it); an explicit N > 1 keeps its chunks, whose tail the dW GEMM hides. Off: the backward of before
  /// this switch (the dW GEMM runs without polling, a serial reduction blocks). Same bits on and off.
  bool tp_comm_bulk_wgrad = false;
  /// --delay-wgrad-compute (Megatron-core's name; Megatron delays the wgrad to overlap MoE's all-to-all, coc to
  /// overlap the TP reduction): the row layer's backward queues its weight- and bias-gradient work in
  /// `delayed_wgrad` instead of running it, and the next column layer's backward runs the queue while its dX
  /// reduction is in flight. The row layer's dY and X must stay unchanged until then (the decoder's do).
  bool delay_wgrad_compute = false;
  /// Set by the decoder when a later overlap in the layer's backward can use weight-gradient work (the ring's last
  /// dK, dV hop, RingAttentionOptions::during_last_hop): with delay_wgrad_compute at tp = 1, where the column
  /// layer's dX has no reduction for its dW GEMM to hide, the column layer runs the queue it finds and then queues
  /// its own dW/db work as well. Its dY and X must stay unchanged until the queue runs. (coc's own.)
  bool defer_column_wgrad = false;
  /// Work queued by delay_wgrad_compute, oldest first.
  std::vector<std::function<void()>> delayed_wgrad;
  /// Runs and clears `delayed_wgrad`. Every backward that queues must end with it (the decoder calls it before
  /// each module's post-backward hooks, so gradients are complete when a module's backward ends).
  void run_delayed_wgrad();
  /// --coc-fused-kernel / --use-mc2 validation: each excludes the other, and MC2 needs sequence parallelism
  /// (its placement is the SP one). Throws a uniform kInvalidArgument error naming the flags and the fix.
  static void check_fused_flags(bool fused_kernel, bool mc2, bool sequence_parallel);
  int tp_size() const { return tp->size(); }
  int tp_rank() const { return tp->rank(); }
  /// Rows of the sequence-parallel shard of this rank when the full activation has m rows.
  int64_t shard_rows(int64_t m) const;
  /// Rows this rank holds outside TP regions: shard_rows(m) with SP, m without.
  int64_t local_rows(int64_t m) const { return sequence_parallel ? shard_rows(m) : m; }
};

/// The overlap flags of `coc train` and `coc check`, as parsed (TrainConfig::overlap() collects them).
struct OverlapConfig {
  bool sequence_parallel = false;       ///< --sequence-parallel
  int coc_parallel_num = 4;             ///< --coc-parallel-num (CocOptions::kAuto = auto)
  CocCommAlgo coc_comm_algo = CocCommAlgo::kCollective;  ///< --coc-comm-algo
  std::string customized_coc;           ///< --customized-coc: JSON or @FILE (parse_customized_coc); empty: none
  bool deterministic = false;           ///< --deterministic / --use-deter-comp
  int64_t coc_min_chunk_rows = 1;       ///< --coc-min-chunk-rows
  bool coc_fused_kernel = false;        ///< --coc-fused-kernel
  bool use_mc2 = false;                 ///< --use-mc2
  bool tp_comm_bulk_wgrad = true;       ///< --tp-comm-bulk-wgrad / --disable-tp-comm-bulk-wgrad
  bool delay_wgrad_compute = true;      ///< --delay-wgrad-compute / --no-delay-wgrad-compute
  /// Throws a uniform kInvalidArgument error naming the flag and the fix: N < 1 (other than auto), a bad
  /// customized table, min rows < 1, or fused flags that do not combine (ParallelContext::check_fused_flags).
  void validate() const;
};

/// The one way coc train, coc check and the consistency checks make their layers' context: `group` injected (the
/// TP group), the CoC options from `flags` (validated first), counters into `stats` (may be null).
ParallelContext make_parallel_context(Communicator& group, const OverlapConfig& flags, CocStats* stats);

}  // namespace coc
