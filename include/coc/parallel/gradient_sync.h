// The data-parallel gradient synchronisation of a training step, one interface over its three strategies, so that
// a step reads forward-backward → sync → clip → update whatever the strategy:
//   all-reduce             sync_gradients after the backward (Megatron's DDP without --overlap-grad-reduce)
//   overlapped all-reduce  Megatron's --overlap-grad-reduce: OverlappedGradSync posts each module's reductions from
//                          its post-backward hook in the last micro-batch (grad_sync.h)
//   sharded                ZeRO-1/2/3 (--data-parallel-sharding-strategy optim / optim_grads /
//                          optim_grads_params): FullyShardedDataParallel's module hooks (fsdp.h)
// All three give bitwise-equal gradients, norms and updates under --deterministic (docs/semantics.md §4).
#pragma once

#include <memory>
#include <vector>

#include "coc/comm/mesh.h"
#include "coc/parallel/fsdp.h"
#include "coc/parallel/module_hooks.h"
#include "coc/parallel/param.h"

namespace coc {

/// What make_gradient_sync chooses by.
struct GradSyncOptions {
  /// --data-parallel-sharding-strategy with its prefetch depths, and --deterministic (rank-ordered sums) for every
  /// strategy; kNoShard picks one of the all-reduces.
  FsdpOptions sharding{.strategy = ShardingStrategy::kNoShard};
  /// --overlap-grad-reduce (no_shard only: the sharded strategies always reduce from the hooks).
  bool overlap_grad_reduce = false;
  /// Whether set_switches may turn the overlap on later (the other side of `coc bench train --baseline` has
  /// --overlap-grad-reduce): the overlapped all-reduce is built, with its hook, even when `overlap_grad_reduce` is off.
  bool overlap_grad_reduce_switchable = false;
};

/// One strategy's gradient synchronisation over the model's modules. Call order per iteration: begin_micro_batch
/// before each micro-batch's forward, finish after the last backward, then grad_norm, the optimizer's step on
/// optimizer_params, and after_step. Every call is collective over the groups of the parameters' placements (and
/// the model-parallel group for grad_norm), in the same order on every rank; errors are the collectives'
/// kTimeout/kComm.
class GradientSync {
 public:
  virtual ~GradientSync() = default;

  /// Before each training micro-batch's forward: a backward follows, and `last` says whether it is the
  /// iteration's last (the one whose backward may reduce: gradients accumulate locally before, Megatron's no_sync).
  virtual void begin_micro_batch(bool last) = 0;
  /// After the backward of the last micro-batch: every gradient (or gradient shard) holds the global-batch mean,
  /// reduced and scaled by 1/(dp·cp). Waits for what the hooks posted, and posts and waits for what is left.
  virtual void finish() = 0;
  /// The global L2 norm of the gradient, identical on every rank (grad_norm in grad_sync.h). After finish().
  virtual double grad_norm() = 0;
  /// The parameters AdamW steps (fp32 value and grad): every parameter of the modules, in module order, or the
  /// sharded strategies' shards (FullyShardedDataParallel::shard_params), index-aligned with them.
  virtual ParamList optimizer_params() = 0;
  /// After the optimizer step (ZeRO-1/2 all-gather the updated shards into the full parameters).
  virtual void after_step() = 0;
  /// This rank's bytes of parameters, gradients and optimizer state (fp32 m, v and any master copy), and the
  /// largest transiently gathered window so far (0 for the all-reduces), for the memory line.
  virtual FsdpMemory memory() const = 0;
  /// Seconds this rank waited inside the module hooks since the last call (exposed communication that finish()
  /// does not see; 0 for the all-reduces, whose hooks only post).
  virtual double take_wait_seconds() = 0;
  /// Between iterations (`coc bench train --baseline` switches sides): the prefetch depths of optim_grads_params
  /// (validate_prefetch's errors), whether the overlapped all-reduce posts from its hooks (with it off, finish()
  /// runs sync_gradients) and the sharded strategies' parameter gather type (FullyShardedDataParallel::
  /// set_param_gather_dtype, which follows the GEMMs' compute type). Each strategy takes the settings it has and
  /// ignores the others.
  virtual void set_switches(int forward_prefetch, int backward_prefetch, bool overlap_grad_reduce,
                            DType param_gather_dtype) = 0;
  /// Checkpoints only (they gather and scatter the full optimizer state through it): the sharded strategies'
  /// FullyShardedDataParallel, null for the all-reduces, whose optimizer state is already full.
  virtual FullyShardedDataParallel* sharded() { return nullptr; }
};

/// The strategy of `opts`: sharded for a sharding strategy other than no_shard; otherwise the overlapped all-reduce
/// when --overlap-grad-reduce is on or switchable, else the plain all-reduce. `modules[i]` lists module i's
/// parameters (Decoder::module_params, their concatenation being every parameter); they and `mesh` must outlive
/// the result. Registers the strategy's hooks through `add_hook` (Decoder::add_hook of the model owning
/// `modules`). Collective over the replica groups for the sharded strategies (FullyShardedDataParallel's
/// constructor and its errors); the all-reduces communicate nothing here.
std::unique_ptr<GradientSync> make_gradient_sync(Mesh& mesh, std::vector<ParamList> modules,
                                                 const GradSyncOptions& opts, const HookRegistrar& add_hook);

}  // namespace coc
