// --fp16's loss scaling (coc/model/loss_scaler.h).
#include "coc/model/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "coc/core/error.h"

namespace coc {

void LossScaleConfig::validate() const {
  // The scale multiplies the fp32 loss and its inverse the gradients: beyond fp32's largest finite value every
  // gradient would overflow, and below its smallest normal one the inverse would (and the scaled loss underflow).
  auto positive = [](const char* flag, double v) {
    constexpr float lo = std::numeric_limits<float>::min(), hi = std::numeric_limits<float>::max();
    if (!(std::isfinite(v) && v >= lo && v <= hi))
      throw_invalid("{} {} must be a number from fp32's smallest normal value, {:.3g}, to its largest, {:.3g} "
                    "(Megatron's default start is 2^32)",
                    flag, v, lo, hi);
  };
  if (constant) positive("--loss-scale", *constant);
  positive("--initial-loss-scale", initial);
  positive("--min-loss-scale", min);
  if (min > initial)
    throw_invalid("--min-loss-scale {} is above --initial-loss-scale {}: the scale starts at the initial one and never "
                  "falls below the minimum",
                  min, initial);
  if (window < 1) throw_invalid("--loss-scale-window {} must be >= 1 (good steps before the scale doubles)", window);
  if (hysteresis < 1) throw_invalid("--hysteresis {} must be >= 1 (overflowing steps before the scale halves)", hysteresis);
}

LossScaler::LossScaler(const LossScaleConfig& c)
    : cfg_(c), scale_(c.constant.value_or(c.initial)), hysteresis_left_(c.hysteresis) {
  c.validate();
}

void LossScaler::update(bool found_inf) {
  if (found_inf) ++skipped_;
  if (cfg_.constant) return;
  if (found_inf) {  // DynamicGradScaler.update: the good-step count restarts; halve once hysteresis is spent
    good_steps_ = 0;
    if (--hysteresis_left_ <= 0) scale_ = std::max(scale_ / 2, cfg_.min);
    return;
  }
  if (++good_steps_ == cfg_.window) {
    good_steps_ = 0;
    hysteresis_left_ = cfg_.hysteresis;
    scale_ *= 2;
  }
}

void LossScaler::load_state(const State& s) {
  if (!(std::isfinite(s.scale) && s.scale > 0) || s.good_steps < 0 || s.skipped < 0)
    throw_invalid("the checkpoint's loss scaler state (scale {}, good steps {}, hysteresis left {}, skipped {}) is "
                  "not one a scaler reaches; resume with --no-load-optim to start a fresh scale",
                  s.scale, s.good_steps, s.hysteresis_left, s.skipped);
  skipped_ = s.skipped;
  if (cfg_.constant) return;
  scale_ = s.scale;
  good_steps_ = s.good_steps;
  hysteresis_left_ = s.hysteresis_left;
}

}  // namespace coc
