// AdamW optimizer, learning-rate schedule and gradient-clipping factor for coc::Param shards.
//
// Sources:
//  - AdamW: Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", in the form PyTorch's
//    torch.optim.AdamW and Apex FusedAdam (adam_w_mode, used by Megatron-LM) implement: the decay is scaled by the
//    learning rate, p ← p·(1 − lr·wd) − lr·m̂/(√v̂ + eps), with bias-corrected moments m̂, v̂ (Kingma & Ba 2015).
//  - Schedule: Megatron-LM's OptimizerParamScheduler.get_lr (megatron/core/optimizer_param_scheduler.py): linear
//    warmup from --lr-warmup-init, then --lr-decay-style linear, cosine, constant, inverse-square-root or WSD.
//  - Clipping: Megatron-LM's clip_grad_norm_fp32: scale = max_norm / (norm + 1e-6) when that is < 1.
// Defaults follow the LLaMA / GPT-3 recipe usually passed to Megatron (beta2 0.95, weight decay 0.1, clip 1.0).
//
// With tensor parallelism every rank steps its own shards; TP-replicated params (Placement::tp_sharded false) receive
// identical gradients on all TP ranks and therefore stay identical, because the update is deterministic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coc/core/tensor.h"
#include "coc/parallel/param.h"

namespace coc {

/// --lr-decay-style: the shape of the learning rate after warmup (Megatron's names).
enum class LrDecayStyle { kLinear, kCosine, kConstant, kInverseSquareRoot, kWsd };
/// --lr-wsd-decay-style: the anneal of WSD (warmup-stable-decay) over its last --lr-wsd-decay-iters.
enum class WsdDecayStyle { kLinear, kCosine, kExponential, kMinusSqrt };

/// Parses Megatron's spellings ("linear", "cosine", "constant", "inverse-square-root", "WSD"; "linear", "cosine",
/// "exponential", "minus_sqrt"). Errors: uniform kInvalidArgument naming the flag, the value and the choices.
LrDecayStyle parse_lr_decay_style(const std::string& v);
WsdDecayStyle parse_wsd_decay_style(const std::string& v);
/// The spelling parse_lr_decay_style / parse_wsd_decay_style read.
std::string to_string(LrDecayStyle s);
std::string to_string(WsdDecayStyle s);

/// Optimizer and schedule hyper-parameters; each field names the CLI flag that sets it. Learning rates are
/// dimensionless step sizes; iteration counts are optimizer steps (one per global batch).
struct OptimizerConfig {
  float lr = 3.0e-4f;         ///< --lr: peak learning rate (reached at the end of warmup), >= 0
  float min_lr = 0.0f;        ///< --min-lr: floor of the cosine decay, in [0, lr]
  /// --lr-warmup-iters (or --lr-warmup-fraction × decay_iters, which Megatron does not round): linear ramp from
  /// init_lr to lr over this many steps, >= 0
  double warmup_iters = 0;
  /// --lr-decay-iters (or --lr-decay-samples / global batch, unrounded): the decay reaches min_lr here, >=
  /// warmup_iters. Megatron's rule when the flag is absent: the caller sets it to the number of training steps.
  double decay_iters = 0;
  float init_lr = 0.0f;       ///< --lr-warmup-init: where warmup starts, in [0, lr]
  LrDecayStyle decay_style = LrDecayStyle::kCosine;  ///< --lr-decay-style (coc's default; Megatron's is linear)
  WsdDecayStyle wsd_style = WsdDecayStyle::kExponential;  ///< --lr-wsd-decay-style (Megatron's default)
  int64_t wsd_decay_iters = 0;  ///< --lr-wsd-decay-iters: WSD anneals over the last this many decay steps
  float clip_grad = 1.0f;     ///< --clip-grad: max global L2 grad norm; 0 disables clipping
  float weight_decay = 0.1f;  ///< --weight-decay: decoupled decay, skipped for Param::weight_decay == false
  float beta1 = 0.9f;         ///< --adam-beta1, in [0, 1)
  float beta2 = 0.95f;        ///< --adam-beta2, in [0, 1)
  float eps = 1.0e-8f;        ///< --adam-eps, > 0 (added to √v̂)
};

/// Checks every field; throws a uniform kInvalidArgument error (coc::throw_invalid) whose message names the flag,
/// e.g. "--adam-beta2 must be in [0, 1), got 1".
void validate(const OptimizerConfig& config);

/// Learning rate for optimizer step `iteration` (0-based: the number of steps already taken), exactly as
/// Megatron's OptimizerParamScheduler.get_lr (with steps counted in iterations; W = warmup_iters, D = decay_iters):
///   W > 0 and iteration <= W:  init_lr + (lr − init_lr) · iteration / W   (so step 0 uses init_lr)
///   constant:                  lr
///   iteration > D:             min_lr
///   inverse-square-root:       max(min_lr, lr · √max(W, 1) / √max(iteration, 1))
///   otherwise, with r = (iteration − W) / (D − W): min_lr + (lr − min_lr) · c, where c = 1 − r (linear),
///   ½(1 + cos(π r)) (cosine), or for WSD 1 until the last wsd_decay_iters steps before D and then, over those
///   with q in [0, 1], 1 − q, ½(1 + cos(π q)), 2 · 0.5^q − 1 or 1 − √q (linear, cosine, exponential, minus_sqrt).
/// `config` must be valid; iteration >= 0 (kInternal otherwise).
float lr_at(const OptimizerConfig& config, int64_t iteration);

/// Gradient-clipping factor: min(1, max_norm / (global_norm + 1e-6)), or 1 when max_norm <= 0 (clipping off).
/// global_norm is the L2 norm over all params of all ranks (grad_norm in coc/parallel/grad_sync.h). A
/// non-finite global_norm returns NaN on purpose: AdamW::step rejects it, so a diverged step is never applied
/// silently — the trainer should test std::isfinite(norm) first and report the divergence.
float clip_scale(double global_norm, float max_norm);

/// AdamW over a fixed list of params. State: per param, exp_avg (m) and exp_avg_sq (v), fp32 tensors with the
/// param's shape, plus the number of steps taken (for bias correction). All exposed for checkpoints.
class AdamW {
 public:
  /// Validates `config` (uniform kInvalidArgument) and allocates zero m, v for each param. Params must be non-null,
  /// outlive the optimizer and have grad.shape() == value.shape() (kInternal otherwise).
  AdamW(ParamList params, OptimizerConfig config);

  /// One update of every param. g = grad · grad_scale (grad_scale: clipping factor from clip_scale, times any
  /// other gradient scale); param.grad is not modified. Increments step_count first, then for t = step_count:
  ///   m ← β1·m + (1−β1)·g,  v ← β2·v + (1−β2)·g²
  ///   p ← p·(1 − lr·wd) − lr/(1−β1^t) · m / (√v / √(1−β2^t) + eps)      (wd = 0 if !param.weight_decay)
  /// lr must be finite and >= 0, grad_scale finite and >= 0 (kInternal otherwise).
  void step(float lr, float grad_scale = 1.0f);

  const ParamList& params() const { return params_; }
  const OptimizerConfig& config() const { return config_; }
  /// m and v, index-aligned with params(). Mutable so a checkpoint loader can fill them in place (shapes must be
  /// kept; prefer load_state, which checks).
  std::vector<Tensor>& exp_avg() { return exp_avg_; }
  const std::vector<Tensor>& exp_avg() const { return exp_avg_; }
  std::vector<Tensor>& exp_avg_sq() { return exp_avg_sq_; }
  const std::vector<Tensor>& exp_avg_sq() const { return exp_avg_sq_; }
  /// Steps taken so far (0 before the first step; the t of the bias correction is step_count after increment).
  int64_t step_count() const { return step_count_; }

  /// Restores m, v and the step count from a checkpoint. Throws kCorrupt, naming the param, if the number of
  /// tensors or any shape differs from the params, or if step_count < 0.
  void load_state(std::vector<Tensor> exp_avg, std::vector<Tensor> exp_avg_sq, int64_t step_count);

 private:
  ParamList params_;
  OptimizerConfig config_;
  std::vector<Tensor> exp_avg_;
  std::vector<Tensor> exp_avg_sq_;
  int64_t step_count_ = 0;
};

}  // namespace coc
