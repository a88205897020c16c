// The gradient synchronisation of one training step and the global gradient norm, both driven by each parameter's
// Placement (placement.h). Megatron: finalize_model_grads (the sequence-parallel all-reduce, then the data-parallel
// reduction) and get_grad_norm_fp32 (squares summed over the model-parallel group, replicated tensors counted
// once).
#pragma once

#include <vector>

#include "coc/comm/mesh.h"
#include "coc/parallel/param.h"

namespace coc {

/// Makes every gradient the one of the global batch, in two passes, each posting all its reductions before waiting
/// for any:
///  1. partial sums: the gradient of each parameter with `tp_partial_grad` is summed over TP;
///  2. replicas: every gradient is summed over its `replicas` group, then divided once by dp × cp, the number of
///     ranks whose token means make up the global batch. For dense parameters (replicas dp × cp) that is the
///     mean; an expert's gradient already holds every token its ep group routed to it, so summing over expert-dp
///     and dividing by dp × cp gives the same global mean (Megatron's expert_gradient_scaling_factor). Skipped
///     when there is nothing to sum or scale.
/// Gradients are fp32 [numel] (Param::grad), reduced in place. `deterministic`: each reduction sums in rank order
/// (all_reduce_rows), so the bits do not depend on timing. Parameters without gradients (requires_grad = false)
/// take part too: their zero gradient keeps every rank issuing the same collectives. Collective over every group
/// named by a placement, in the same order on every rank. Errors: the collectives' kTimeout/kComm.
/// `wire` = kBF16 (--grad-reduce-in-bf16): the replica sums move bf16 (all_reduce_rows' wire); the tp partial sums
/// stay fp32.
void sync_gradients(Mesh& mesh, const ParamList& params, bool deterministic, DType wire = DType::kF32);

/// Megatron's --overlap-grad-reduce for unsharded data parallelism: sync_gradients in buckets of one module each,
/// posted from the module's post-backward hook (in the last micro-batch) so that the replica reductions of later
/// modules run under the backward of earlier ones. Each gradient goes through the same reductions as in
/// sync_gradients (the tp partial sum, waited at once because the replica sum needs it; then the sum over its
/// replicas, not waited) and the same 1/(dp·cp) scaling, so the bits equal sync_gradients' under --deterministic.
class OverlappedGradSync {
 public:
  OverlappedGradSync(Mesh& mesh, bool deterministic, DType wire = DType::kF32)
      : mesh_(mesh), deterministic_(deterministic), wire_(wire) {}
  /// Posts the reductions of one module's gradients (collective over the groups of its placements, in the same
  /// order on every rank). The gradients must not change until finish().
  void post(const ParamList& module);
  /// Waits for everything posted since the last finish() and scales those gradients to the global-batch mean.
  void finish();
  /// Whether anything was posted since the last finish().
  bool pending() const { return !posted_.empty(); }

 private:
  Mesh& mesh_;
  bool deterministic_;
  DType wire_;  ///< the replica sums' element type (sync_gradients' `wire`)
  std::vector<Work> works_;
  ParamList posted_;
};

/// The L2 norm of the full model's gradient (every element of every parameter counted once), identical on every
/// rank. Dense parameters: squares summed over the model-parallel group (TP), a TP-replicated tensor counted on TP
/// rank 0 only; expert parameters: the same over the expert-model-parallel group (tp × ep). Call after
/// sync_gradients (replicas then hold equal gradients). Accumulated in double per rank, reduced in fp32 (as
/// Megatron). Collective over the model-parallel group(s). Under pipeline parallelism (mesh.pp_size() > 1) the
/// dense terms of every stage are added in stage order first (gathered over pp: the order and bits of P = 1), then
/// reduced over tp.
double grad_norm(Mesh& mesh, const ParamList& params);

/// The tail of grad_norm, for callers that computed this rank's sums of squares themselves (sharded data
/// parallelism, fsdp.h): `dense_squares` over this rank's dense parameters (TP-replicated ones on TP rank 0 only),
/// `expert_squares` over its expert parameters. Returns the global L2 norm. Collective as grad_norm. With pp > 1
/// both must already hold every stage's (pipeline_squares): the dense sum is reduced over tp only, the expert sum
/// over tp × ep × pp with only stage 0's counted.
double grad_norm_of_squares(Mesh& mesh, double dense_squares, double expert_squares, bool any_expert);

/// Sums of squares of every pipeline stage (pipeline_squares).
struct StageSquares {
  double dense = 0, expert = 0;
  bool any_expert = false;  ///< some stage has expert parameters: the expert reduction runs (on every stage)
};
/// Pipeline parallelism: `dense` and `expert`, this stage's per-parameter sums of squares (double, in parameter
/// order) of its dense and expert parameters (TP-replicated ones on TP rank 0 only), each added into one double on
/// stage 0 in stage order and then parameter order (P = 1's order of the same terms, so the bits of P = 1's sums)
/// and broadcast, so every stage returns the same values; `any_expert`: this stage has expert parameters (on every
/// TP rank alike). Collective over `pp` (gather_bytes, broadcast_bytes; their kTimeout/kComm errors).
/// Used by grad_norm and by sharded data parallelism (fsdp.h), which then call grad_norm_of_squares.
StageSquares pipeline_squares(Communicator& pp, const std::vector<double>& dense, const std::vector<double>& expert,
                              bool any_expert);

}  // namespace coc
