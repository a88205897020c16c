// --fp16's loss scaler (model/loss_scaler.h) against Megatron's DynamicGradScaler and ConstantGradScaler: hysteresis
// before halving, the floor, doubling after a window of good steps, the skip count, and the flags' validation.
#include <gtest/gtest.h>

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
  EXPECT_NE(message(c).find("--loss-scale -1 must be a finite number > 0"), std::string::npos);
}

}  // namespace
}  // namespace coc
