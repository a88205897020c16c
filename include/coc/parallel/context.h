// What every tensor-parallel layer is given at construction (linear.h, vocab_parallel.h): the group its ops run on,
// whether sequence parallelism is on, and the CoC options (N, determinism, stats). The caller builds the context
// once (make_parallel_context) and injects it, as Megatron-core passes tp_group and its TransformerConfig to its
// layers; the layers keep a const pointer and read it at call time, so it must outlive them. Nothing writes a
// context during a step: `coc bench train --baseline` and sampling re-point the layers at another context
// (Decoder::set_parallel_context), and what changes within one backward (the delayed weight-gradient work) lives
// in a WgradQueue the caller owns and passes to each backward.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "coc/comm/communicator.h"
#include "coc/overlap/coc_ops.h"

namespace coc {

/// What the vocabulary-parallel embedding and output layer communicate under sequence parallelism
/// (--vocab-parallel-comm; coc's own, beyond Megatron, which always communicates activations). Both keep the
/// weights, their gradients and the optimizer state sharded by vocabulary rows (split_rows(V, T, r)).
///  - kActivations (Megatron): the embedding reduce-scatters its [m, H] output and all-gathers its [m_r, H] output
///    gradient; the output layer all-gathers its [m_r, H] input and reduce-scatters its [m, H] input gradient,
///    and the cross-entropy all-reduces [m] statistics. 4·m·H·4 bytes per micro-batch, on the critical path.
///  - kWeights: each layer all-gathers its [V_r, H] weight shards into the full [V, H] weight, works on this rank's
///    m_r rows against the whole vocabulary (no activation collective; a local cross-entropy), and reduce-scatters
///    its [V, H] weight gradient back to the shards. 4·V·H·4 bytes, 16x fewer for coc's byte vocabulary (V = 256)
///    at m = 4096 tokens; the gathered weight and its gradient cost about 2·V·H·4 bytes of memory per layer.
///  - kAuto: kWeights when sequence parallelism is on, tp > 1, V < m and V·H·4 ≤ 64 MiB; else kActivations
///    (docs/semantics.md §2).
/// Both are the same model and the same gradients up to rounding (the reduction orders differ), so a run's losses
/// stay bitwise reproducible under --deterministic for either mode, not across them.
enum class VocabComm { kAuto, kActivations, kWeights };

/// "auto", "activations" or "weights"; throws kInvalidArgument naming the flag for anything else.
VocabComm parse_vocab_comm(const std::string& s);
const char* to_string(VocabComm c);

struct ParallelContext {
  /// The group the layers' CoC ops and collectives run on: the TP group (size T); not owned.
  Communicator* tp = nullptr;
  bool sequence_parallel = false; ///< --sequence-parallel: activations outside TP regions are split along rows
  CocOptions coc;                 ///< --coc-parallel-num etc.; each op call copies it and sets tag and fused
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
  /// (progress_during, comm/progress.h). Under --coc-parallel-num auto or 1 the reduction is one non-blocking
  /// collective after the whole dX GEMM (TransformerEngine's "bulk" overlap: the dW GEMM, as long as the dX GEMM,
  /// hides it); an explicit N > 1 keeps its chunks, whose tail the dW GEMM hides. Off: the backward of before
  /// this switch (the dW GEMM runs without polling, a serial reduction blocks). Same bits on and off.
  bool tp_comm_bulk_wgrad = false;
  /// --delay-wgrad-compute (Megatron-core's name; Megatron delays the wgrad to overlap MoE's all-to-all, coc to
  /// overlap the TP reduction): the row layer's backward queues its weight- and bias-gradient work in the
  /// WgradQueue it is given instead of running it, and the next column layer's backward runs the queue while its dX
  /// reduction is in flight. The row layer's dY and X must stay unchanged until then (the TransformerLayer's do).
  bool delay_wgrad_compute = false;
  /// --delay-column-wgrad (coc's own, beyond Megatron; needs delay_wgrad_compute and sequence parallelism): the
  /// MLP's column layer (gate_up) leaves the queued work (the down projection's wgrad) for the attention output
  /// projection's backward, which runs it while its dY all-gather is in flight (RowParallelLinear::backward);
  /// gate_up's own dW GEMM alone hides its dX reduce-scatter. Without it the projection's all-gather has only its
  /// own dX GEMM to hide behind, which is shorter than the transfer. With attention_dense_backward_pipeline only
  /// the ranks that wait for their first dY segment run it there; the others leave it for qkv's backward.
  bool delay_column_wgrad = false;
  /// delay_column_wgrad's condition, shared by the column layer that leaves the queue and the row layer that runs
  /// it: SP over tp > 1, delay_wgrad_compute, and a row backward that posts its gather whole (N = 1 or auto, no
  /// customized table, no fused kernel or MC2). Elsewhere the queue would only move to a later column layer.
  bool wgrad_under_row_gather() const;
  /// --attention-dense-pipeline (coc's own, beyond Megatron): the TransformerLayer computes attention query block by
  /// query block as the output projection's (dense) CoC op asks for its rows (CocOptions::produce_rows), so that the
  /// projection's reduce-scatter (SP) or all-reduce of one chunk is in flight while attention computes the next chunk's
  /// rows, instead of only while the projection's own, shorter GEMM runs. Same bits on and off.
  bool attention_dense_pipeline = false;
  /// --attention-dense-backward-pipeline (coc's own, beyond Megatron): the backward counterpart. With SP, the
  /// output projection's backward gathers dY in segments, last rows first, and hands out dX's rows as they arrive
  /// (RowParallelLinear::backward's consumer); the layer runs attention's backward on each query block once its
  /// rows are in, so that the gather's later segments are in flight meanwhile. Same bits on and off in
  /// deterministic mode; otherwise the projection's dX GEMM, split by rows, may round differently.
  bool attention_dense_backward_pipeline = false;
  /// --swiglu-down-pipeline (coc's own, beyond Megatron): as attention_dense_pipeline for the MLP, the layer
  /// computes SwiGLU's rows as the down projection's CoC op asks for them, so that SwiGLU runs while the chunks
  /// before are in flight. SwiGLU is row by row: same bits on and off.
  bool swiglu_down_pipeline = false;
  /// --attention-qkv-backward-pipeline (coc's own, beyond Megatron): the backward counterpart of the layer boundary
  /// under qkv. The qkv layer's backward (a compute-first CoC op: dX GEMM, then its reduce-scatter with SP or
  /// all-reduce without) takes its chunks last rows first and asks attention's backward for the rows of dQKV as
  /// it needs them (CocOptions::last_rows_first, produce_rows), so that the reduction of the last rows is in flight
  /// while attention's backward computes the earlier query blocks, instead of starting after all of it. With
  /// attention_dense_backward_pipeline the projection's backward leaves the blocks it would run after its last dY
  /// segment has arrived to this pipeline, where a transfer can use them. Same bits on and off in deterministic
  /// mode; otherwise qkv's dX GEMM, split by rows, may round differently. Not with ring attention (cp > 1).
  bool attention_qkv_backward_pipeline = false;
  /// --swiglu-down-backward-pipeline (coc's own, beyond Megatron): swiglu_down_pipeline's backward counterpart. With
  /// SP, the down projection's backward gathers dY in segments (RowParallelLinear::backward's consumer, as
  /// attention_dense_backward_pipeline's) and the layer runs SwiGLU's backward on each segment's rows of dX as they
  /// are computed, while the later segments fly, instead of over all rows after the gather. SwiGLU is row by row:
  /// same bits on and off in deterministic mode; otherwise the projection's dX GEMM, split by rows, may round
  /// differently.
  bool swiglu_down_backward_pipeline = false;
  /// --vocab-parallel-comm (VocabComm above); resolve with gathers_vocab_weights().
  VocabComm vocab_comm = VocabComm::kActivations;
  /// Whether the vocabulary layers take the kWeights path for a micro-batch of m tokens (every rank decides alike).
  bool gathers_vocab_weights(int64_t vocab, int64_t hidden, int64_t m) const;
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

/// Weight-gradient work that --delay-wgrad-compute moves later within one backward, oldest first. Whoever runs the
/// backward owns it (the Decoder one per model, a standalone check one per layer) and passes it to the linear
/// layers' backward; the layers never keep it. Every backward that queues must end with run() (the decoder runs it
/// before each module's post-backward hooks, so gradients are complete when a module's backward ends). The queued
/// work reads the dY and X its layer saw, which must stay unchanged until then.
class WgradQueue {
 public:
  void push(std::function<void()> work) { work_.push_back(std::move(work)); }
  /// Runs the queued work in order and clears the queue.
  void run();
  bool empty() const { return work_.empty(); }

 private:
  std::vector<std::function<void()>> work_;
};

/// What one ColumnParallelLinear::backward call does with delayed weight-gradient work; the caller knows it per call.
struct ColumnWgrad {
  WgradQueue* queue = nullptr;  ///< null: nothing is queued; the layer's dW/db run at once
  /// A later overlap in the same backward can use weight-gradient work (the ring's last dK, dV hop,
  /// RingAttentionOptions::during_last_hop): with delay_wgrad_compute at tp = 1, where the dX has no reduction for
  /// the dW GEMM to hide, the layer runs the queue it finds and then queues its own dW/db work as well. (coc's own.)
  bool defer_own = false;
  /// The queue this layer finds is left for the next row layer's dY all-gather in the same module
  /// (ParallelContext::delay_column_wgrad; it applies where wgrad_under_row_gather() holds).
  bool leave_for_row_gather = false;
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
  VocabComm vocab_comm = VocabComm::kAuto;  ///< --vocab-parallel-comm
  bool delay_column_wgrad = true;       ///< --delay-column-wgrad / --no-delay-column-wgrad
  bool attention_dense_pipeline = true; ///< --attention-dense-pipeline / --no-attention-dense-pipeline
  /// --attention-dense-backward-pipeline / --no-attention-dense-backward-pipeline
  bool attention_dense_backward_pipeline = true;
  bool swiglu_down_pipeline = true;  ///< --swiglu-down-pipeline / --no-swiglu-down-pipeline
  /// --attention-qkv-backward-pipeline / --no-attention-qkv-backward-pipeline
  bool attention_qkv_backward_pipeline = true;
  /// --swiglu-down-backward-pipeline / --no-swiglu-down-backward-pipeline
  bool swiglu_down_backward_pipeline = true;
  /// The element type of the TP ops' messages (CocOptions::comm_dtype): kBF16 under --bf16, whose activations are
  /// bf16 values already; kF32 otherwise (--fp16 keeps fp32 messages: the ops move fp32 and bf16 only).
  DType comm_dtype = DType::kF32;
  /// Throws a uniform kInvalidArgument error naming the flag and the fix: N < 1 (other than auto), a bad
  /// customized table, min rows < 1, or fused flags that do not combine (ParallelContext::check_fused_flags).
  void validate() const;
};

/// The one way coc train, coc check and the consistency checks make their layers' context: `group` injected (the
/// TP group), the CoC options from `flags` (validated first), counters into `stats` (may be null).
ParallelContext make_parallel_context(Communicator& group, const OverlapConfig& flags, CocStats* stats);

}  // namespace coc
