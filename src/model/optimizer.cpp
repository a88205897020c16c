// AdamW, Megatron's cosine learning-rate schedule and the grad-clip factor. See optimizer.h for the sources.
#include "coc/model/optimizer.h"

#include <cmath>
#include <limits>
#include <numbers>

#include "coc/core/error.h"
#include "coc/runtime/tracer.h"

namespace coc {

void validate(const OptimizerConfig& c) {
  auto finite_nonneg = [](float x) { return std::isfinite(x) && x >= 0.0f; };
  if (!finite_nonneg(c.lr)) throw_invalid("--lr must be a finite number >= 0, got {}", c.lr);
  if (!finite_nonneg(c.min_lr) || c.min_lr > c.lr)
    throw_invalid("--min-lr must be in [0, --lr] = [0, {}], got {}", c.lr, c.min_lr);
  if (c.warmup_iters < 0) throw_invalid("--lr-warmup-iters must be >= 0, got {}", c.warmup_iters);
  if (c.decay_iters < 0) throw_invalid("--lr-decay-iters must be >= 0, got {}", c.decay_iters);
  if (c.warmup_iters > c.decay_iters)
    throw_invalid("--lr-warmup-iters ({}) must not exceed --lr-decay-iters ({}): the cosine decay starts after warmup",
                  c.warmup_iters, c.decay_iters);
  if (!finite_nonneg(c.clip_grad))
    throw_invalid("--clip-grad must be a finite number >= 0 (0 disables clipping), got {}", c.clip_grad);
  if (!finite_nonneg(c.weight_decay))
    throw_invalid("--weight-decay must be a finite number >= 0, got {}", c.weight_decay);
  // beta = 1 would freeze the moment at its initial 0 and make the bias correction 1/(1−1^t) divide by zero.
  if (!(c.beta1 >= 0.0f && c.beta1 < 1.0f)) throw_invalid("--adam-beta1 must be in [0, 1), got {}", c.beta1);
  if (!(c.beta2 >= 0.0f && c.beta2 < 1.0f)) throw_invalid("--adam-beta2 must be in [0, 1), got {}", c.beta2);
  if (!(std::isfinite(c.eps) && c.eps > 0.0f)) throw_invalid("--adam-eps must be a finite number > 0, got {}", c.eps);
}

float lr_at(const OptimizerConfig& c, int64_t it) {
  COC_ASSERT(it >= 0, "lr_at: iteration {}", it);
  if (c.warmup_iters > 0 && it <= c.warmup_iters)
    return static_cast<float>(static_cast<double>(c.lr) * static_cast<double>(it) /
                              static_cast<double>(c.warmup_iters));
  // Also covers warmup_iters == decay_iters (no decay phase), where the ratio below would divide by zero.
  if (it >= c.decay_iters) return c.min_lr;
  const double ratio = static_cast<double>(it - c.warmup_iters) / static_cast<double>(c.decay_iters - c.warmup_iters);
  const double coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  return static_cast<float>(c.min_lr + coeff * (static_cast<double>(c.lr) - c.min_lr));
}

float clip_scale(double global_norm, float max_norm) {
  if (!std::isfinite(global_norm)) return std::numeric_limits<float>::quiet_NaN();
  if (max_norm <= 0.0f) return 1.0f;
  const double s = static_cast<double>(max_norm) / (global_norm + 1.0e-6);
  return s < 1.0 ? static_cast<float>(s) : 1.0f;
}

AdamW::AdamW(ParamList params, OptimizerConfig config) : params_(std::move(params)), config_(config) {
  validate(config_);
  exp_avg_.reserve(params_.size());
  exp_avg_sq_.reserve(params_.size());
  for (const Param* p : params_) {
    COC_ASSERT(p != nullptr, "AdamW: null param");
    COC_ASSERT(p->grad.shape() == p->value.shape(), "AdamW: param {} value {} but grad {}", p->name,
               p->value.shape_str(), p->grad.shape_str());
    exp_avg_.emplace_back(p->value.shape());
    exp_avg_sq_.emplace_back(p->value.shape());
  }
}

void AdamW::step(float lr, float grad_scale) {
  COC_ASSERT(std::isfinite(lr) && lr >= 0.0f, "AdamW::step: lr {}", lr);
  COC_ASSERT(std::isfinite(grad_scale) && grad_scale >= 0.0f,
             "AdamW::step: grad_scale {} (a non-finite grad norm must be handled before stepping)", grad_scale);
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "adamw_step", {"params", static_cast<int64_t>(params_.size())});
  ++step_count_;
  const double t = static_cast<double>(step_count_);
  const float b1 = config_.beta1, b2 = config_.beta2, eps = config_.eps;
  // Bias corrections in fp64: β2^t for β2 = 0.95..0.999 underflows gracefully, and 1 − β^t loses digits in fp32
  // for small t.
  const float step_size = static_cast<float>(lr / (1.0 - std::pow(static_cast<double>(b1), t)));
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(b2), t)));
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = *params_[i];
    COC_ASSERT(p.value.numel() == exp_avg_[i].numel() && p.grad.numel() == p.value.numel(),
               "AdamW::step: param {} changed size", p.name);
    const float decay = p.weight_decay ? 1.0f - lr * config_.weight_decay : 1.0f;
    float* w = p.value.data();
    const float* g = p.grad.data();
    float* m = exp_avg_[i].data();
    float* v = exp_avg_sq_[i].data();
    for (int64_t j = 0; j < p.value.numel(); ++j) {
      const float gj = g[j] * grad_scale;
      m[j] = b1 * m[j] + (1.0f - b1) * gj;
      v[j] = b2 * v[j] + (1.0f - b2) * gj * gj;
      // Decoupled decay uses the pre-update weight, as in PyTorch AdamW and Apex FusedAdam.
      w[j] = w[j] * decay - step_size * m[j] / (std::sqrt(v[j]) * inv_sqrt_bc2 + eps);
    }
  }
}

void AdamW::load_state(std::vector<Tensor> exp_avg, std::vector<Tensor> exp_avg_sq, int64_t step_count) {
  if (exp_avg.size() != params_.size() || exp_avg_sq.size() != params_.size())
    throw_error(ErrorKind::kCorrupt, "optimizer state has {} exp_avg and {} exp_avg_sq tensors for {} params",
                exp_avg.size(), exp_avg_sq.size(), params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& p = *params_[i];
    if (exp_avg[i].shape() != p.value.shape() || exp_avg_sq[i].shape() != p.value.shape())
      throw_error(ErrorKind::kCorrupt, "optimizer state of param {}: exp_avg {}, exp_avg_sq {}, expected {}", p.name,
                  exp_avg[i].shape_str(), exp_avg_sq[i].shape_str(), p.value.shape_str());
  }
  if (step_count < 0) throw_error(ErrorKind::kCorrupt, "optimizer step count {} is negative", step_count);
  exp_avg_ = std::move(exp_avg);
  exp_avg_sq_ = std::move(exp_avg_sq);
  step_count_ = step_count;
}

}  // namespace coc
