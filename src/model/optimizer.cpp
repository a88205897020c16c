// AdamW, Megatron's learning-rate schedules and the grad-clip factor. See optimizer.h for the sources.
#include "coc/model/optimizer.h"

#include <algorithm>
#include <cmath>
#include <iterator>
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
    throw_invalid("--lr-warmup-iters ({}) must not exceed --lr-decay-iters ({}): the decay starts after warmup",
                  c.warmup_iters, c.decay_iters);
  if (!finite_nonneg(c.init_lr) || c.init_lr > c.lr)
    throw_invalid("--lr-warmup-init must be in [0, --lr] = [0, {}], got {}", c.lr, c.init_lr);
  if (c.decay_style == LrDecayStyle::kWsd &&
      (c.wsd_decay_iters < 1 || static_cast<double>(c.wsd_decay_iters) > c.decay_iters))
    throw_invalid("--lr-decay-style WSD needs --lr-wsd-decay-iters in [1, --lr-decay-iters = {}] (got {}): the "
                  "number of final steps over which it anneals",
                  c.decay_iters, c.wsd_decay_iters);
  if (!finite_nonneg(c.clip_grad))
    throw_invalid("--clip-grad must be a finite number >= 0 (0 disables clipping), got {}", c.clip_grad);
  if (!finite_nonneg(c.weight_decay))
    throw_invalid("--weight-decay must be a finite number >= 0, got {}", c.weight_decay);
  // beta = 1 would freeze the moment at its initial 0 and make the bias correction 1/(1−1^t) divide by zero.
  if (!(c.beta1 >= 0.0f && c.beta1 < 1.0f)) throw_invalid("--adam-beta1 must be in [0, 1), got {}", c.beta1);
  if (!(c.beta2 >= 0.0f && c.beta2 < 1.0f)) throw_invalid("--adam-beta2 must be in [0, 1), got {}", c.beta2);
  if (!(std::isfinite(c.eps) && c.eps > 0.0f)) throw_invalid("--adam-eps must be a finite number > 0, got {}", c.eps);
}

namespace {
// Megatron's spellings, in the enums' order.
constexpr const char* kLrDecayStyles[] = {"linear", "cosine", "constant", "inverse-square-root", "WSD"};
constexpr const char* kWsdDecayStyles[] = {"linear", "cosine", "exponential", "minus_sqrt"};
}  // namespace

LrDecayStyle parse_lr_decay_style(const std::string& v) {
  for (size_t i = 0; i < std::size(kLrDecayStyles); ++i)
    if (v == kLrDecayStyles[i]) return static_cast<LrDecayStyle>(i);
  throw_invalid("--lr-decay-style {}: use linear, cosine, constant, inverse-square-root or WSD (Megatron's names)", v);
}

WsdDecayStyle parse_wsd_decay_style(const std::string& v) {
  for (size_t i = 0; i < std::size(kWsdDecayStyles); ++i)
    if (v == kWsdDecayStyles[i]) return static_cast<WsdDecayStyle>(i);
  throw_invalid("--lr-wsd-decay-style {}: use linear, cosine, exponential or minus_sqrt (Megatron's names)", v);
}

std::string to_string(LrDecayStyle s) { return kLrDecayStyles[static_cast<size_t>(s)]; }
std::string to_string(WsdDecayStyle s) { return kWsdDecayStyles[static_cast<size_t>(s)]; }

namespace {
/// Megatron's decay coefficient in [0, 1] at step `it` of the decay phase (W < it <= D), by style.
double decay_coeff(const OptimizerConfig& c, double it) {
  const double w = c.warmup_iters, d = c.decay_iters;
  const double r = (it - w) / (d - w);
  switch (c.decay_style) {
    case LrDecayStyle::kLinear: return 1.0 - r;
    case LrDecayStyle::kCosine: return 0.5 * (std::cos(std::numbers::pi * r) + 1.0);
    case LrDecayStyle::kWsd: {
      const double anneal_start = d - static_cast<double>(c.wsd_decay_iters);
      if (it <= anneal_start) return 1.0;
      const double q = (it - anneal_start) / static_cast<double>(c.wsd_decay_iters);
      switch (c.wsd_style) {
        case WsdDecayStyle::kLinear: return 1.0 - q;
        case WsdDecayStyle::kCosine: return 0.5 * (std::cos(std::numbers::pi * q) + 1.0);
        case WsdDecayStyle::kExponential: return 2.0 * std::pow(0.5, q) - 1.0;
        case WsdDecayStyle::kMinusSqrt: return 1.0 - std::sqrt(q);
      }
      break;
    }
    case LrDecayStyle::kConstant:
    case LrDecayStyle::kInverseSquareRoot: break;  // handled by lr_at
  }
  COC_ASSERT(false, "decay_coeff: style {}", static_cast<int>(c.decay_style));
  return 0;
}
}  // namespace

float lr_at(const OptimizerConfig& c, int64_t iteration) {
  COC_ASSERT(iteration >= 0, "lr_at: iteration {}", iteration);
  const double it = static_cast<double>(iteration), lr = c.lr, min_lr = c.min_lr;
  if (c.warmup_iters > 0 && it <= c.warmup_iters)
    return static_cast<float>(c.init_lr + (lr - c.init_lr) * it / c.warmup_iters);
  if (c.decay_style == LrDecayStyle::kConstant) return c.lr;
  // Also covers warmup_iters == decay_iters (no decay phase), where the ratio would divide by zero.
  if (it > c.decay_iters || c.warmup_iters >= c.decay_iters) return c.min_lr;
  if (c.decay_style == LrDecayStyle::kInverseSquareRoot)
    return static_cast<float>(
        std::max(min_lr, lr * std::sqrt(std::max(c.warmup_iters, 1.0)) / std::sqrt(std::max(it, 1.0))));
  return static_cast<float>(min_lr + decay_coeff(c, it) * (lr - min_lr));
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

namespace {

struct AdamWBuffers {
  float* w;
  const float* g;
  float* m;
  float* v;
  int64_t n;
};
struct AdamWScalars {
  float b1, b2, eps, grad_scale, decay, step_size, inv_sqrt_bc2;
};

/// One parameter's update, element by element. Compiled for AVX-512, AVX2 and x86-64 (target_clones) with
/// -O3 -fno-math-errno -ffp-contract=off (CMakeLists.txt): an elementwise loop has the same bits in every clone
/// (sqrt and division are correctly rounded in vector form too, nothing is fused), and without the flags GCC keeps
/// it scalar for errno's sake (perf: 3% of a bf16 step at issue 35's shape).
__attribute__((target_clones("avx512f", "avx2", "default"))) void adamw_update(AdamWBuffers b, AdamWScalars s) {
  for (int64_t j = 0; j < b.n; ++j) {
    const float gj = b.g[j] * s.grad_scale;
    b.m[j] = s.b1 * b.m[j] + (1.0f - s.b1) * gj;
    b.v[j] = s.b2 * b.v[j] + (1.0f - s.b2) * gj * gj;
    // Decoupled decay uses the pre-update weight, as in PyTorch AdamW and Apex FusedAdam.
    b.w[j] = b.w[j] * s.decay - s.step_size * b.m[j] / (std::sqrt(b.v[j]) * s.inv_sqrt_bc2 + s.eps);
  }
}

}  // namespace

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
    adamw_update({p.value.data(), p.grad.data(), exp_avg_[i].data(), exp_avg_sq_[i].data(), p.value.numel()},
                 {b1, b2, eps, grad_scale, decay, step_size, inv_sqrt_bc2});
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
