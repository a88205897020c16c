#include "coc/parallel/gradient_sync.h"

#include <utility>

#include "coc/parallel/grad_sync.h"

namespace coc {

namespace {

/// sync_gradients over every parameter after the backward; AdamW steps the full parameters.
class AllReduceGradSync : public GradientSync {
 public:
  AllReduceGradSync(Mesh& mesh, const std::vector<ParamList>& modules, bool deterministic, DType wire)
      : mesh_(mesh), deterministic_(deterministic), wire_(wire) {
    for (const ParamList& m : modules) params_.insert(params_.end(), m.begin(), m.end());
  }
  void begin_micro_batch(bool) override {}
  void finish() override { sync_gradients(mesh_, params_, deterministic_, wire_); }
  double grad_norm() override { return coc::grad_norm(mesh_, params_); }
  ParamList optimizer_params() override { return params_; }
  void after_step() override {}
  FsdpMemory memory() const override {
    FsdpMemory m;
    for (const Param* p : params_) {
      m.parameters += p->value.numel() * 4;
      m.gradients += p->grad.numel() * 4;
      m.optimizer += 2 * p->value.numel() * 4;  // AdamW's m and v; the parameter is its own master copy
    }
    return m;
  }
  double take_wait_seconds() override { return 0; }
  void set_switches(int, int, bool, DType) override {}

 protected:
  Mesh& mesh_;
  const bool deterministic_;
  const DType wire_;  ///< FsdpOptions::grad_reduce_dtype
  ParamList params_;
};

/// Megatron's --overlap-grad-reduce: while `enabled_`, each module's post-backward hook in the last micro-batch
/// posts its reductions (OverlappedGradSync) and finish() waits for them; when nothing was posted (the overlap
/// switched off) finish() is the plain all-reduce's. The bits are the same either way.
class OverlappedAllReduceGradSync : public AllReduceGradSync {
 public:
  OverlappedAllReduceGradSync(Mesh& mesh, std::vector<ParamList> modules, bool deterministic, DType wire,
                              bool enabled, const HookRegistrar& add_hook)
      : AllReduceGradSync(mesh, modules, deterministic, wire),
        modules_(std::move(modules)),
        overlap_(mesh, deterministic, wire),
        enabled_(enabled) {
    add_hook(HookPoint::kPostBackward, [this](int i) {
      if (enabled_ && last_micro_batch_) overlap_.post(modules_[static_cast<size_t>(i)]);
    });
  }
  void begin_micro_batch(bool last) override { last_micro_batch_ = last; }
  void finish() override {
    if (overlap_.pending())
      overlap_.finish();
    else
      AllReduceGradSync::finish();
  }
  void set_switches(int, int, bool overlap_grad_reduce, DType) override { enabled_ = overlap_grad_reduce; }

 private:
  std::vector<ParamList> modules_;
  OverlappedGradSync overlap_;
  bool enabled_, last_micro_batch_ = false;
};

/// ZeRO-1/2/3: FullyShardedDataParallel in the four module hooks; AdamW steps its shards.
class ShardedGradSync : public GradientSync {
 public:
  ShardedGradSync(Mesh& mesh, std::vector<ParamList> modules, const FsdpOptions& opts, const HookRegistrar& add_hook)
      : fsdp_(mesh, std::move(modules), opts) {
    FullyShardedDataParallel* f = &fsdp_;
    add_hook(HookPoint::kPreForward, [f](int i) { f->pre_forward(i); });
    add_hook(HookPoint::kPostForward, [f](int i) { f->post_forward(i); });
    add_hook(HookPoint::kPreBackward, [f](int i) { f->pre_backward(i); });
    add_hook(HookPoint::kPostBackward, [f](int i) { f->post_backward(i); });
  }
  void begin_micro_batch(bool last) override { fsdp_.begin_forward(last); }
  void finish() override { fsdp_.finish_gradients(); }
  double grad_norm() override { return fsdp_.grad_norm(); }
  ParamList optimizer_params() override { return fsdp_.shard_params(); }
  void after_step() override { fsdp_.after_step(); }
  FsdpMemory memory() const override { return fsdp_.memory(); }
  double take_wait_seconds() override { return fsdp_.take_wait_seconds(); }
  void set_switches(int forward_prefetch, int backward_prefetch, bool, DType param_gather_dtype) override {
    fsdp_.set_prefetch(forward_prefetch, backward_prefetch);
    fsdp_.set_param_gather_dtype(param_gather_dtype);
  }
  FullyShardedDataParallel* sharded() override { return &fsdp_; }

 private:
  FullyShardedDataParallel fsdp_;
};

}  // namespace

std::unique_ptr<GradientSync> make_gradient_sync(Mesh& mesh, std::vector<ParamList> modules,
                                                 const GradSyncOptions& opts, const HookRegistrar& add_hook) {
  if (opts.sharding.strategy != ShardingStrategy::kNoShard)
    return std::make_unique<ShardedGradSync>(mesh, std::move(modules), opts.sharding, add_hook);
  const bool deterministic = opts.sharding.deterministic;
  const DType wire = opts.sharding.grad_reduce_dtype;
  if (opts.overlap_grad_reduce || opts.overlap_grad_reduce_switchable)
    return std::make_unique<OverlappedAllReduceGradSync>(mesh, std::move(modules), deterministic, wire,
                                                         opts.overlap_grad_reduce, add_hook);
  return std::make_unique<AllReduceGradSync>(mesh, modules, deterministic, wire);
}

}  // namespace coc
