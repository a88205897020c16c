// --fp16's loss scaling, as Megatron's grad scalers (megatron/core/optimizer/grad_scaler.py: ConstantGradScaler and
// DynamicGradScaler): the loss is multiplied by a scale S before backward so that small fp16 gradients do not
// underflow; the gradients are divided by S before the optimizer step. A step whose gradients hold an inf or NaN
// (the fp16 values overflowed) is skipped. The dynamic scaler then halves S after `hysteresis` such steps (not below
// the minimum), and doubles it after `window` good steps in a row.
#pragma once

#include <cstdint>
#include <optional>

namespace coc {

/// The flags (Megatron's names and defaults).
struct LossScaleConfig {
  std::optional<double> constant;  ///< --loss-scale S: a fixed scale (a power of 2 keeps the unscaling exact)
  double initial = 4294967296.0;   ///< --initial-loss-scale (2^32)
  double min = 1.0;                ///< --min-loss-scale
  int64_t window = 1000;           ///< --loss-scale-window: good steps before S doubles
  int64_t hysteresis = 2;          ///< --hysteresis: overflowing steps before S halves
  /// Throws a uniform kInvalidArgument error naming the flag: a scale outside fp32's normal range, a minimum above
  /// the initial scale, a window or hysteresis below 1.
  void validate() const;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& c);
  /// The scale of the next backward.
  double scale() const { return scale_; }
  /// Records a step's outcome: `found_inf` (some gradient was inf or NaN) counts a skipped step and may halve the
  /// scale; a good step may double it. The caller skips the optimizer step itself.
  void update(bool found_inf);
  int64_t skipped() const { return skipped_; }

  /// What a checkpoint keeps (Megatron saves its scaler's state_dict with the optimizer): the scale, the good steps
  /// in a row, the overflows left before the next halving (below 0 once the scale halves at every overflow, as
  /// Megatron's hysteresis tracker), and the skipped steps so far.
  struct State {
    double scale = 0;
    int64_t good_steps = 0;
    int64_t hysteresis_left = 0;
    int64_t skipped = 0;
  };
  State state() const { return {scale_, good_steps_, hysteresis_left_, skipped_}; }
  /// Resumes from a checkpoint's state. A --loss-scale run keeps its constant scale (the flag wins, as in
  /// Megatron, whose ConstantGradScaler has no state). Throws a uniform kInvalidArgument error for a state no
  /// scaler reaches (scale not finite and > 0, negative step counts).
  void load_state(const State& s);

 private:
  LossScaleConfig cfg_;
  double scale_;
  int64_t good_steps_ = 0;
  int64_t hysteresis_left_;
  int64_t skipped_ = 0;
};

}  // namespace coc
