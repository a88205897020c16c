// Sharded data parallelism (ZeRO-1/2/3, FSDP) over each parameter's data-parallel replicas, with Megatron-FSDP's
// strategy names (--data-parallel-sharding-strategy) and PyTorch FSDP2's forward/backward prefetch
// (--num-to-forward-prefetch F, --num-to-backward-prefetch B). Semantics: docs/semantics.md §4.
//
// Shards. A parameter of n elements (this rank's tp shard, flattened) is split over its `replicas` group
// (placement.h: dp × cp for dense weights, expert-dp for experts) of D ranks as split_rows(n, D, r) (the first
// n mod D ranks hold one element more); every shard is stored in a buffer of ceil(n / D) elements whose tail is
// zero padding, so that any shape works on any D. The padding is never sent and never reaches the optimizer's
// result (AdamW keeps a zero weight with a zero gradient at zero).
//
// The strategies:
//   no_shard            this class is not used (sync_gradients all-reduces every gradient)
//   optim               ZeRO-1 (Megatron's distributed optimizer): AdamW state and the fp32 update on the shard;
//                       each module's gradients reduce-scattered when its backward ends (last micro-batch), the
//                       updated shards all-gathered into the full parameters after the step
//   optim_grads         ZeRO-2: as optim, and the full gradient buffers exist only from a module's backward to its
//                       reduce-scatter, which is waited after the next module's backward (at most two modules'
//                       full gradients at once, except while micro-batches accumulate)
//   optim_grads_params  ZeRO-3 / FSDP: the parameters too; a module's full parameters exist only from its gather
//                       (before its forward, again before its backward) to its free (after it)
// The reduce-scatter is the all-reduce of no_shard restricted to the shard (the same rank-ordered sum under
// --deterministic, then the same 1/(dp·cp) scaling), the AdamW update is element-wise, and the gradient norm
// continues each parameter's sum of squares across the shards in rank order, so a sharded run is bitwise equal to
// no_shard with --deterministic.
//
// Progress. With --comm-engine inline, MPI moves a posted collective only inside an MPI call, and at tp = 1 no CoC
// op makes one during a module's GEMMs. So from each pre-hook to the matching post-hook, while any collective is in
// flight, the engine lends a polling thread (lend_progress, comm/progress.h).
//
// Prefetch (optim_grads_params). Module i's pre-forward hook waits for i's gather (posting it first when nothing
// prefetched it) and posts the gathers of i+1..i+F; its post-forward hook frees it. Backward does the same over the
// reversed order with B, except that module i's post-backward hook, having freed i, already posts the gathers of
// i−2..i−1−B (which i−1's pre-backward would post), ahead of i's reduce-scatters on the link. The head's parameters
// stay gathered between its forward and its backward when a backward follows (begin_forward), which is PyTorch's
// "the root is not resharded after forward"; with B ≥ 1 so do those of the module before it, the first the
// backward needs. So at most max(F, B)+1 modules are unsharded at once. Every gather is waited before its
// parameters are read; everything still gathered is waited and freed at the end of a forward without backward and
// at the end of each backward.
//
// Gradient accumulation: the gradients of all micro-batches accumulate in full buffers; the reduce-scatter runs in
// the backward of the last micro-batch only (Megatron's no_sync for all but the last), so the sums are those of
// no_shard.
//
// 16-bit gathers (FsdpOptions::param_gather_dtype, kBF16 under --bf16): a parameter that only compute-type GEMMs
// read (Param::read_as_compute_type) is gathered in 2-byte elements, every other one (norms, biases, the router) in
// fp32. AdamW steps the fp32 master shards, never a gathered copy, and checkpoints gather from those shards, so a
// bf16 run stays bitwise equal to no_shard under --deterministic and resumes bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coc/comm/mesh.h"
#include "coc/comm/progress.h"
#include "coc/comm/work.h"
#include "coc/parallel/param.h"

namespace coc {

/// --data-parallel-sharding-strategy (Megatron-FSDP's names).
enum class ShardingStrategy { kNoShard, kOptim, kOptimGrads, kOptimGradsParams };
const char* to_string(ShardingStrategy s);
/// "no_shard" | "optim" | "optim_grads" | "optim_grads_params"; throws a uniform kInvalidArgument error naming
/// --data-parallel-sharding-strategy and the valid values otherwise.
ShardingStrategy parse_sharding_strategy(const std::string& s);

struct FsdpOptions {
  ShardingStrategy strategy = ShardingStrategy::kOptimGradsParams;
  int forward_prefetch = 1;   ///< --num-to-forward-prefetch F (>= 0; clamped to the modules that follow)
  int backward_prefetch = 1;  ///< --num-to-backward-prefetch B (>= 0)
  bool deterministic = false; ///< rank-ordered reduce-scatter sums and the chained gradient norm
  /// The element type of the data-parallel gradient reduction, for every strategy (--grad-reduce-in-bf16: kBF16,
  /// all_reduce_rows/reduce_scatter_rows' wire; the gradients stay fp32 and are rounded when sent). The tp
  /// all-reduce of sequence-parallel partial gradients stays fp32.
  DType grad_reduce_dtype = DType::kF32;
  /// The element type of the parameter all-gathers (optim_grads_params' gathers before each module's forward and
  /// backward, optim's and optim_grads' after the step) of the parameters with Param::read_as_compute_type: kBF16
  /// under --bf16 (the trainer sets it; Megatron has no flag for it either, its bf16 model parameters are what its
  /// distributed optimizer and FSDP gather). Each rank rounds its fp32 master shard when it sends and the receivers
  /// widen, so the full parameter holds the bf16 values that the GEMMs reading it would round to anyway: the same
  /// bits, half the bytes. Every other parameter, the checkpoints' gathers and the master shards stay fp32.
  DType param_gather_dtype = DType::kF32;
  /// Tests only: when non-zero, every parameter gather sleeps a pseudo-random 0..2 ms (seeded by this value, the
  /// rank and the gather's count) before it is posted, so that arrival order and timing vary between runs.
  uint64_t random_delay_seed = 0;
};

/// Checks F and B: a negative value throws a uniform kInvalidArgument error naming the flag.
void validate_prefetch(int forward_prefetch, int backward_prefetch);

/// Bytes one rank holds, for the memory line (FullyShardedDataParallel::memory).
struct FsdpMemory {
  int64_t parameters = 0;   ///< persistent parameter storage (full for optim/optim_grads, the shards for ZeRO-3)
  int64_t gradients = 0;    ///< persistent gradient storage (full for optim, shards for optim_grads and up)
  int64_t optimizer = 0;    ///< AdamW's m and v (shards) plus the fp32 master shards
  int64_t window_peak = 0;  ///< the largest sum of transiently gathered parameters and gradients seen so far
};

class FullyShardedDataParallel {
 public:
  /// `modules[i]` lists module i's parameters (Decoder::module_params), which must hold their full (tp-shard)
  /// values. Takes each parameter's shard; under optim_grads_params frees the full values. `strategy` must not be
  /// kNoShard (kInternal). Collective over the replica groups (it splits its own communicators from them). The
  /// mesh and params must outlive this.
  FullyShardedDataParallel(Mesh& mesh, std::vector<ParamList> modules, FsdpOptions opts);
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // ---- Module hooks (Decoder::add_hook); collective over the replica groups, same order on every rank ----
  void pre_forward(int module);
  void post_forward(int module);
  void pre_backward(int module);
  void post_backward(int module);

  /// Before each training micro-batch's forward: a backward follows (the head stays gathered), and `last` says
  /// whether that backward reduce-scatters (the last micro-batch of the iteration).
  void begin_forward(bool last);
  /// Waits for every reduce-scatter still in flight and scales the shards to the global-batch mean (1/(dp·cp));
  /// the post-backward hooks already did so for all but the last module.
  /// Call after the backward of the last micro-batch, before grad_norm and the step.
  void finish_gradients();
  /// The global L2 norm of the gradient (grad_norm in grad_sync.h, from the gradient shards); identical on every
  /// rank, and bitwise equal to no_shard's under --deterministic.
  double grad_norm();
  /// The shards as parameters (value and grad [ceil(n / D)]), index-aligned with the flat list of all modules'
  /// parameters: AdamW steps these.
  ParamList shard_params();
  /// After the optimizer step: optim and optim_grads all-gather the updated shards into the full parameters
  /// (blocking; in param_gather_dtype where read_as_compute_type, so the full buffer may then hold the bf16
  /// values, which only compute-type GEMMs and the rounded embedding lookup read); optim_grads_params has nothing
  /// to do (the shards are the parameters).
  void after_step();

  /// Checkpoints: gathers every full parameter from the fp32 master shards, whatever the strategy and
  /// param_gather_dtype (optim_grads_params allocates them; optim and optim_grads overwrite their full buffers,
  /// which may hold bf16 values after a bf16 gather, with the masters' values: their GEMMs round both alike), and
  /// returns the full AdamW moments [param shape] gathered from `exp_avg` / `exp_avg_sq` (the shard moments,
  /// aligned with shard_params). Collective over the replica groups. Call release_full() when done.
  void gather_full_state(const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                         std::vector<Tensor>& full_exp_avg, std::vector<Tensor>& full_exp_avg_sq);
  /// Allocates every full parameter (for a checkpoint load to fill).
  void allocate_full();
  /// Takes this rank's shards of the full parameters (which the caller filled) and of `full_exp_avg(_sq)` into the
  /// shard parameters and `exp_avg(_sq)` (shard moments).
  void scatter_full_state(const std::vector<Tensor>& full_exp_avg, const std::vector<Tensor>& full_exp_avg_sq,
                          std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq);
  /// optim_grads_params: frees every full parameter again (after gather_full_state or allocate_full).
  void release_full();

  /// Changes F and B between iterations (`coc bench train --baseline`); validate_prefetch's errors. Only when no
  /// pass is under way (between iterations): nothing is gathered then.
  void set_prefetch(int forward_prefetch, int backward_prefetch);
  /// Changes FsdpOptions::param_gather_dtype between iterations (`coc bench train --bf16 --baseline --no-bf16`
  /// switches the GEMMs' compute type with it): kF32 or kBF16, else kInvalidArgument. Switching optim or
  /// optim_grads from kBF16 to kF32 gathers the full parameters again in fp32 (collective, blocking), since fp32
  /// GEMMs must not read the bf16 values left by the last step's gather.
  void set_param_gather_dtype(DType t);

  /// Seconds this rank waited for its gathers and reduce-scatters since the last call (exposed communication).
  double take_wait_seconds() {
    const double s = wait_s_;
    wait_s_ = 0;
    return s;
  }

  /// This rank's bytes so far.
  FsdpMemory memory() const;
  /// Modules whose full parameters are allocated right now (tests: at most F+1 / B+1).
  int modules_unsharded() const;
  /// The most modules unsharded at once so far.
  int max_modules_unsharded() const { return max_unsharded_; }
  const FsdpOptions& options() const { return opts_; }

 private:
  struct Shard;
  struct Module;
  void gather(int module);        ///< posts the gathers of a module's parameters (allocating them) if not yet
  void wait_gathered(int module); ///< waits for them (posting first if needed)
  void free_params(int module);
  void reshard_all();             ///< waits any gather in flight and frees every module
  void reduce_scatter(int module);
  void complete_reduction(int module);  ///< waits a module's reduce-scatters, scales its shards, frees full grads
  void account_window();
  void lend_poller();  ///< takes lease_ when the engine needs one (see "Progress" above)
  bool shards_params() const { return opts_.strategy == ShardingStrategy::kOptimGradsParams; }
  bool shards_grads() const { return opts_.strategy != ShardingStrategy::kOptim; }
  DType wire_of(const Shard& s) const;  ///< the element type of `s`'s parameter gathers (param_gather_dtype's rule)
  void gather_all_params();              ///< optim, optim_grads: every full parameter from its shard (blocking)

  /// Its own communicator per replica group ("fsdp dp-cp", ...; created on first use, in parameter order, so
  /// collectively): its collectives never queue behind other traffic of the group, and the profile draws them on
  /// a track of their own.
  Communicator& comm_of(MeshGroup g);

  Mesh& mesh_;
  FsdpOptions opts_;
  std::vector<std::pair<MeshGroup, std::unique_ptr<Communicator>>> comms_;
  std::vector<std::unique_ptr<Module>> modules_;
  std::vector<Shard*> shards_;  ///< every parameter, in module order
  bool backward_follows_ = false, reduce_now_ = true;
  int64_t window_bytes_ = 0, window_peak_ = 0;
  int max_unsharded_ = 0;
  uint64_t delay_state_ = 0;
  double wait_s_ = 0;
  /// Held from a module's pre-hook to its post-hook while collectives are in flight, so that the inline engine
  /// moves them during the module's compute (nothing else would at tp = 1); the threaded engine needs none.
  std::unique_ptr<ProgressLease> lease_;
};

}  // namespace coc
