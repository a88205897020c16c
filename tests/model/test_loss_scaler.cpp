// --fp16's loss scaler (model/loss_scaler.h) against Megatron's DynamicGradScaler and ConstantGradScaler: hysteresis
// before halving, the floor, doubling after a window of good steps, the skip count, resuming from a checkpoint's
// state, and the flags' validation.
#include <gtest/gtest.h>

#include <limits>

#include <vector>

#include "coc/core/error.h"
#include "coc/model/loss_scaler.h"

namespace coc {
namespace {

TEST(LossScaler, HalvesAfterHysteresisAndNotBelowTheMinimum) {
  LossScaleConfig c;
  c.initial = 8;
  c.min = 2;
  c.hysteresis = 2;
  LossScaler s(c);
  s.update(true);
  EXPECT_EQ(s.scale(), 8) << "the first overflow spends hysteresis";
  s.update(true);
  EXPECT_EQ(s.scale(), 4);
  s.update(true);
  EXPECT_EQ(s.scale(), 2) << "hysteresis is not restored by an overflow";
  s.update(true);
  EXPECT_EQ(s.scale(), 2) << "the floor";
  EXPECT_EQ(s.skipped(), 4);
}

TEST(LossScaler, DoublesAfterAWindowOfGoodStepsAndAnOverflowRestartsIt) {
  LossScaleConfig c;
  c.initial = 4;
  c.window = 3;
  c.hysteresis = 1;
  LossScaler s(c);
  s.update(false);
  s.update(false);
  s.update(true);  // restarts the window and halves (hysteresis 1)
  EXPECT_EQ(s.scale(), 2);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 2);
  s.update(false);
  EXPECT_EQ(s.scale(), 4);
  EXPECT_EQ(s.skipped(), 1);
}

TEST(LossScaler, AConstantScaleOnlyCountsSkips) {
  LossScaleConfig c;
  c.constant = 1024;
  LossScaler s(c);
  for (int i = 0; i < 5; ++i) s.update(i % 2 == 0);
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.skipped(), 3);
}

TEST(LossScaler, ResumesFromItsStateAsIfNeverStopped) {
  LossScaleConfig c;
  c.initial = 64;
  c.window = 3;
  c.hysteresis = 2;
  const std::vector<bool> overflows = {true, true, true, false, false, true, false, false, false, false};
  LossScaler whole(c), first(c), second(c);
  for (size_t i = 0; i < overflows.size(); ++i) {
    whole.update(overflows[i]);
    if (i < 5) first.update(overflows[i]);
    if (i == 4) second.load_state(first.state());
    if (i > 4) second.update(overflows[i]);
    if (i >= 4) EXPECT_EQ(second.scale(), whole.scale()) << "step " << i;
  }
  EXPECT_EQ(second.skipped(), whole.skipped());
  EXPECT_EQ(second.state().hysteresis_left, whole.state().hysteresis_left);
  EXPECT_THROW(second.load_state({0.0, 0, 0, 0}), Error);
  LossScaleConfig k;
  k.constant = 8;
  LossScaler fixed(k);
  fixed.load_state({1024.0, 0, 2, 3});  // the flag's constant scale wins; the skip count carries on
  EXPECT_EQ(fixed.scale(), 8);
  EXPECT_EQ(fixed.skipped(), 3);
}

TEST(LossScaler, BadFlagsAreOneClearError) {
  auto message = [](LossScaleConfig c) {
    try {
      c.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  LossScaleConfig c;
  EXPECT_EQ(message(c), "no error");
  c.window = 0;
  EXPECT_NE(message(c).find("--loss-scale-window 0 must be >= 1"), std::string::npos);
  c = {};
  c.min = 1e12;
  EXPECT_NE(message(c).find("--min-loss-scale"), std::string::npos);
  c = {};
  c.constant = -1;
  EXPECT_NE(message(c).find("--loss-scale -1 must be a number from fp32's smallest normal"), std::string::npos);
  c.constant = 1e40;  // beyond fp32: the scaled loss would be inf and every step skipped
  EXPECT_NE(message(c).find("--loss-scale 1e+40 must be"), std::string::npos);
  c.constant = 1e-40;  // its inverse, which unscales the gradients, would be inf
  EXPECT_NE(message(c).find("--loss-scale 1e-40 must be"), std::string::npos);
  c = {};
  c.initial = std::numeric_limits<double>::infinity();
  EXPECT_NE(message(c).find("--initial-loss-scale inf must be"), std::string::npos);
  c = {};
  c.min = 1e-45;
  EXPECT_NE(message(c).find("--min-loss-scale 1e-45 must be"), std::string::npos);
}

}  // namespace
}  // namespace coc
