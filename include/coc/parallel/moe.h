// Mixture-of-experts layer with expert parallelism (Megatron-core's MoELayer: TopKRouter, token dispatcher,
// GroupedMLP; MindSpeed-LLM's eager / fused / mc2 expert-parallel dispatchers; docs/semantics.md §6).
//
// Shapes: x, y [T tokens, H hidden] (this rank's tokens; T may be 0). E experts, each a SwiGLU MLP
// y_e(x) = (silu(x·W_gateᵀ) ⊙ x·W_upᵀ)·W_downᵀ with F = ffn hidden; the EP ranks hold Le = E/EP experts each
// (rank r: experts [r·Le, (r+1)·Le)). The router is a [E, H] linear, softmax, top-k; y[t] = Σ_j w[t,j]·y_{e_tj}(x[t]).
//
// Data flow of a forward (every dispatcher): route → count the slots per expert → exchange the counts with
// typed calls → permute (the slots sorted by expert) → dispatch (all-to-all(v) over ep) → grouped GEMM gate/up →
// SwiGLU → grouped GEMM down → combine (all-to-all(v) back) → unpermute weighted by the top-k weights. On an
// expert's rank its tokens lie expert-major, then by source rank: expert le's rows are [le: src 0, src 1, ...],
// the order each rank RECEIVED them, and its weight gradient is one GEMM per expert over those rows.
//   eager  Megatron's alltoall dispatcher: one all-to-all(v), a sort into the expert-major order, the grouped
//          GEMMs, the reverse sort, one all-to-all(v) back. Nothing overlaps.
//   fused  one point-to-point exchange whose receives land directly in the expert-major order (no sort copies)
//          in and out.
//   mc2    the exchange pipelined with the grouped GEMM (Ascend MC2's alltoallv + grouped matmul): the slots are
//          chunked per source rank (own rank first) and per local expert into `mc2_chunks` row chunks; all chunk
//          exchanges are posted up front (paced, so they arrive in order), and each chunk's expert MLP runs as
//          soon as it has arrived while later chunks are still in flight (communicate-first on the way in); each
//          chunk's result is sent back as soon as it is computed (compute-first on the way out). The weight
//          gradients are computed once per expert over all its rows after the pipeline; in deterministic
//          mode (MoeConfig::deterministic) mc2 with any chunk count equals eager bitwise.
// Every EP rank takes part in every collective, also with no tokens at all.
//
// The load-balancing loss (kernels/moe.h) is taken over the tokens of `token_group` (the ranks that together hold
// the global batch: dp × cp in a decoder), so its value and gradient do not depend on dp or ep.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "coc/comm/communicator.h"
#include "coc/kernels/moe.h"
#include "coc/parallel/param.h"

namespace coc {

enum class MoeDispatcher { kEager, kFused, kMc2 };
const char* to_string(MoeDispatcher d);
/// "eager" | "fused" | "mc2"; anything else: uniform kInvalidArgument naming --ep-dispatcher.
MoeDispatcher parse_moe_dispatcher(const std::string& s);

struct MoeConfig {
  int64_t hidden = 0;      ///< H
  int64_t ffn_hidden = 0;  ///< F, each expert's SwiGLU width (--moe-ffn-hidden-size)
  int num_experts = 0;     ///< E (--num-experts)
  int topk = 1;            ///< K (--moe-router-topk)
  double capacity_factor = 0;  ///< --moe-expert-capacity-factor; <= 0 in the config: no dropping (flag must be > 0)
  double aux_loss_coeff = 0;   ///< --moe-aux-loss-coeff
  /// The aux loss gradient is multiplied by this (1: the exact partial derivative of the global loss; a trainer
  /// that averages gradients over the token group passes its size so that the mean is the exact gradient).
  double aux_grad_scale = 1;
  MoeDispatcher dispatcher = MoeDispatcher::kEager;  ///< --ep-dispatcher
  int mc2_chunks = 2;                                ///< mc2: row chunks per (source rank, local expert), >= 1
  /// --deterministic: the experts' row-wise GEMMs (forward, and backward dX) run per (local expert, source rank)
  /// block in fixed tiles of `deterministic_tile_rows` rows, and mc2 chunks whole tiles, so every dispatcher and
  /// chunk count calls the same GEMMs on the same rows: bitwise equal results (BLAS results for a row depend on
  /// the other rows of the call). Otherwise eager and fused run one GEMM per local expert over all its rows.
  bool deterministic = false;
  int64_t deterministic_tile_rows = 64;
  RouterPattern fixed_router = RouterPattern::kNone;  ///< --moe-fixed-router (debug)
  /// The element type of the token exchange (issue 35): kBF16 under --bf16 (the layer sets it from the
  /// ParallelContext's comm_dtype), kF32 otherwise. Under kBF16 every exchange travels as 2-byte elements: the
  /// dispatched rows (tokens forward, output gradients backward) unchanged in value, the combined rows (expert
  /// outputs forward, the experts' input gradients backward) rounded to bf16 (docs/mixed-precision.md).
  DType comm_dtype = DType::kF32;
};

/// Checks a config against the EP size: one uniform kInvalidArgument line naming the flag and the fix for
/// E < 1, E not divisible by EP, top-k outside [1, E], mc2 chunks < 1, sizes < 1.
void check_moe_config(const MoeConfig& c, int ep_size);

class MoeLayer {
 public:
  /// `ep`: the expert-parallel group (collective ops of the dispatch); `token_group`: the ranks sharing the global
  /// batch (aux loss). Both must outlive the layer. Weights are initialised from `seed` as the FULL model's
  /// tensors, each rank keeping its experts, so that every EP size starts from the same model: router [E, H]
  /// and w_gate_up [E·2F, H] (expert e's gate rows [e·2F, e·2F+F), up rows after) and w_down [E·H, F], uniform in
  /// ±1/sqrt(fan_in).
  MoeLayer(const MoeConfig& cfg, Communicator& ep, Communicator& token_group, const std::string& name,
           uint64_t seed);

  /// x [T, H] → y [T, H] (overwritten). `token_offset`: the global index of row 0 (only the fixed router reads
  /// it). Saves what backward needs. Collective over ep and token_group.
  void forward(ConstMatrixView x, MatrixView y, int64_t token_offset = 0);
  /// dy [T, H] → dx [T, H] (overwritten); accumulates the gradients of router, w_gate_up (local experts) and
  /// w_down, including the aux loss's. Collective over ep.
  void backward(ConstMatrixView dy, MatrixView dx);

  /// The load-balancing loss of the last forward (global, the same on every rank), already times its coeff.
  double aux_loss() const { return aux_loss_; }
  /// Slots routed to each local expert in the last forward, summed over the sources (after dropping).
  const std::vector<int64_t>& local_expert_tokens() const { return local_rows_; }
  const MoeConfig& config() const { return cfg_; }
  /// MoeConfig::aux_grad_scale from the next backward on (a trainer sets it per micro-batch scale).
  void set_aux_grad_scale(double s) { cfg_.aux_grad_scale = s; }
  /// The dispatcher and mc2 chunk count (>= 1) of the next forward and backward (every dispatcher reads the same
  /// plan, so a switch between iterations is safe; `coc bench train --baseline` switches it).
  void set_dispatcher(MoeDispatcher d, int mc2_chunks);
  /// MoeConfig::comm_dtype from the next forward on: kF32 or kBF16 (anything else throws kInvalidArgument).
  void set_comm_dtype(DType t);
  int local_experts() const { return local_experts_; }
  /// The last forward's plan (routing, token counts, the activations backward reads) as an opaque shared handle,
  /// null before the first forward; set_plan puts such a handle back, so that backward runs on that forward's
  /// micro-batch. Pipeline parallelism keeps several micro-batches in flight on a stage (model/pipeline_schedule.h):
  /// each keeps its plan with its activations (LayerActivations::moe_plan).
  std::shared_ptr<void> plan() const { return plan_; }
  void set_plan(std::shared_ptr<void> plan) { plan_ = std::static_pointer_cast<Plan>(std::move(plan)); }
  ParamList params() { return {&router, &w_gate_up, &w_down}; }

  Param router;     ///< [E, H], replicated over ep, mean over the token group; read in fp32 (GemmComputeScope)
  Param w_gate_up;  ///< [Le·2F, H], this rank's experts; read only by GEMMs (Param::read_as_compute_type)
  Param w_down;     ///< [Le·H, F]; likewise

 private:
  /// The last forward's routing, token counts (sent per expert, received per local expert and source rank) and
  /// the activations backward needs.
  struct Plan;
  MoeConfig cfg_;
  Communicator& ep_;
  Communicator& tokens_;
  int local_experts_ = 1;
  double aux_loss_ = 0;
  std::vector<int64_t> local_rows_;
  std::shared_ptr<Plan> plan_;  ///< the last forward's routing, counts and saved activations
};

}  // namespace coc
