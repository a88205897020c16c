// AdamW: config validation names the flag; one and two steps match values computed by hand in fp64; weight decay
// is skipped where Param::weight_decay is false; the cosine schedule's endpoints and shape; the clip factor; and
// state save/restore.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "coc/core/error.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/model/optimizer.h"

namespace coc {
namespace {

Param make_param(const std::string& name, std::vector<float> value, std::vector<float> grad, bool wd = true) {
  Param p;
  p.name = name;
  p.value = Tensor({static_cast<int64_t>(value.size())});
  p.grad = Tensor({static_cast<int64_t>(grad.size())});
  for (size_t i = 0; i < value.size(); ++i) p.value[static_cast<int64_t>(i)] = value[i];
  for (size_t i = 0; i < grad.size(); ++i) p.grad[static_cast<int64_t>(i)] = grad[i];
  p.weight_decay = wd;
  return p;
}

// Expects validate() to throw a uniform kInvalidArgument error whose message contains `flag`.
void expect_rejected(const OptimizerConfig& c, const std::string& flag) {
  try {
    validate(c);
    ADD_FAILURE() << "accepted a bad " << flag;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    EXPECT_TRUE(e.uniform()) << e.what();
    EXPECT_NE(std::string(e.what()).find(flag), std::string::npos)
        << "message does not name " << flag << ": " << e.what();
  }
}

TEST(OptimizerConfig, DefaultsAreMegatronLlamaRecipeAndValid) {
  const OptimizerConfig c;
  EXPECT_FLOAT_EQ(c.beta1, 0.9f);
  EXPECT_FLOAT_EQ(c.beta2, 0.95f);
  EXPECT_FLOAT_EQ(c.eps, 1e-8f);
  EXPECT_FLOAT_EQ(c.weight_decay, 0.1f);
  EXPECT_FLOAT_EQ(c.clip_grad, 1.0f);
  EXPECT_NO_THROW(validate(c));
}

TEST(OptimizerConfig, BadValuesNameTheirFlag) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto with = [](auto f) {
    OptimizerConfig c;
    c.warmup_iters = 10;
    c.decay_iters = 100;
    f(c);
    return c;
  };
  expect_rejected(with([](auto& c) { c.lr = -1e-3f; }), "--lr");
  expect_rejected(with([&](auto& c) { c.lr = nan; }), "--lr");
  expect_rejected(with([](auto& c) { c.min_lr = -1e-5f; }), "--min-lr");
  expect_rejected(with([](auto& c) { c.min_lr = 1.0f; }), "--min-lr");  // above --lr
  expect_rejected(with([](auto& c) { c.warmup_iters = -1; }), "--lr-warmup-iters");
  expect_rejected(with([](auto& c) { c.decay_iters = -5; }), "--lr-decay-iters");
  expect_rejected(with([](auto& c) { c.warmup_iters = 101; }), "--lr-warmup-iters");
  expect_rejected(with([](auto& c) { c.warmup_iters = 101; }), "--lr-decay-iters");
  expect_rejected(with([](auto& c) { c.clip_grad = -1.0f; }), "--clip-grad");
  expect_rejected(with([](auto& c) { c.clip_grad = std::numeric_limits<float>::infinity(); }), "--clip-grad");
  expect_rejected(with([](auto& c) { c.weight_decay = -0.1f; }), "--weight-decay");
  expect_rejected(with([](auto& c) { c.beta1 = 1.0f; }), "--adam-beta1");
  expect_rejected(with([](auto& c) { c.beta1 = -0.1f; }), "--adam-beta1");
  expect_rejected(with([&](auto& c) { c.beta1 = nan; }), "--adam-beta1");
  expect_rejected(with([](auto& c) { c.beta2 = 1.0f; }), "--adam-beta2");
  expect_rejected(with([](auto& c) { c.beta2 = 1.5f; }), "--adam-beta2");
  expect_rejected(with([](auto& c) { c.eps = 0.0f; }), "--adam-eps");
  // Boundary values that are fine.
  EXPECT_NO_THROW(validate(with([](auto& c) {
    c.beta1 = 0.0f;
    c.clip_grad = 0.0f;
    c.weight_decay = 0.0f;
  })));
  EXPECT_NO_THROW(validate(with([](auto& c) { c.warmup_iters = 100; })));  // warmup == decay
  // The constructor validates too.
  Param p = make_param("w", {1.0f}, {1.0f});
  EXPECT_THROW(AdamW({&p}, with([](auto& c) { c.beta2 = 1.0f; })), Error);
}

TEST(AdamW, OneStepMatchesHandComputedValue) {
  // t = 1: m̂ = g, v̂ = g², so the Adam direction is g/(|g| + eps) ≈ sign(g).
  // p = 1, grad = 0.1, grad_scale = 0.5 → g = 0.05; lr = 1e-3, wd = 0.1:
  // p' = 1·(1 − 1e-3·0.1) − 1e-3 · 0.05/(0.05 + 1e-8) = 0.9999 − 0.00099999980 = 0.99890000020.
  OptimizerConfig c;
  Param p = make_param("w", {1.0f, -2.0f, 0.5f}, {0.1f, -0.2f, 0.0f});
  AdamW opt({&p}, c);
  EXPECT_EQ(opt.step_count(), 0);
  opt.step(1e-3f, 0.5f);
  EXPECT_EQ(opt.step_count(), 1);
  EXPECT_NEAR(p.value[0], 0.9989000002, 1e-7);
  EXPECT_NEAR(p.value[1], -2.0 * 0.9999 + 1e-3 * 0.1 / (0.1 + 1e-8), 2e-7);
  EXPECT_NEAR(p.value[2], 0.5 * 0.9999, 1e-7);  // zero gradient: decay only
  // fp32 rounding of 1 − β (0.1 → 0.100000024) bounds the agreement at a few 1e-7 relative.
  EXPECT_NEAR(opt.exp_avg()[0][0], 0.1 * 0.05, 5e-9);
  EXPECT_NEAR(opt.exp_avg_sq()[0][0], 0.05 * 0.05 * 0.05, 1e-10);
  // The gradient itself is left alone (the trainer zeroes it).
  EXPECT_FLOAT_EQ(p.grad[0], 0.1f);
}

TEST(AdamW, TwoStepsMatchFp64Formula) {
  OptimizerConfig c;
  c.beta1 = 0.8f;
  c.beta2 = 0.9f;
  c.eps = 1e-3f;  // large enough to matter
  c.weight_decay = 0.05f;
  const std::vector<float> w0 = {0.3f, -1.2f, 2.0f, 0.0f, -0.7f};
  const std::vector<float> g1 = {0.5f, -0.25f, 0.01f, 1.0f, -2.0f}, g2 = {-0.4f, 0.3f, 0.02f, 0.5f, 1.5f};
  Param p = make_param("w", w0, g1);
  AdamW opt({&p}, c);
  const double lrs[2] = {2e-2, 1e-2}, scales[2] = {0.7, 1.0};
  std::vector<double> w(w0.begin(), w0.end()), m(w0.size(), 0.0), v(w0.size(), 0.0);
  for (int t = 1; t <= 2; ++t) {
    const auto& g = t == 1 ? g1 : g2;
    for (size_t i = 0; i < g.size(); ++i) p.grad[static_cast<int64_t>(i)] = g[i];
    opt.step(static_cast<float>(lrs[t - 1]), static_cast<float>(scales[t - 1]));
    const double b1 = c.beta1, b2 = c.beta2, lr = lrs[t - 1];
    for (size_t i = 0; i < w.size(); ++i) {
      const double gi = static_cast<double>(g[i]) * scales[t - 1];
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      const double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
      w[i] = w[i] - lr * (mh / (std::sqrt(vh) + c.eps) + static_cast<double>(c.weight_decay) * w[i]);
    }
    for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(p.value[static_cast<int64_t>(i)], w[i], 1e-6) << t << " " << i;
  }
}

TEST(AdamW, WeightDecaySkippedWhereFlagged) {
  OptimizerConfig c;
  c.weight_decay = 0.5f;
  Param decayed = make_param("w", {2.0f, -4.0f}, {0.0f, 0.0f}, /*wd=*/true);
  Param norm = make_param("norm.weight", {2.0f, -4.0f}, {0.0f, 0.0f}, /*wd=*/false);
  AdamW opt({&decayed, &norm}, c);
  opt.step(0.1f);
  // Zero gradient: the Adam term is 0/(0 + eps) = 0, so only the decoupled decay moves the weight.
  EXPECT_FLOAT_EQ(decayed.value[0], 2.0f * (1.0f - 0.1f * 0.5f));
  EXPECT_FLOAT_EQ(decayed.value[1], -4.0f * (1.0f - 0.1f * 0.5f));
  EXPECT_EQ(norm.value[0], 2.0f);
  EXPECT_EQ(norm.value[1], -4.0f);
}

TEST(AdamW, RejectsNonFiniteGradScale) {
  Param p = make_param("w", {1.0f}, {1.0f});
  AdamW opt({&p}, OptimizerConfig{});
  EXPECT_THROW(opt.step(1e-3f, clip_scale(std::numeric_limits<double>::quiet_NaN(), 1.0f)), Error);
  EXPECT_THROW(opt.step(1e-3f, clip_scale(std::numeric_limits<double>::infinity(), 1.0f)), Error);
  EXPECT_EQ(p.value[0], 1.0f);  // nothing applied
  EXPECT_EQ(opt.step_count(), 0);
}

TEST(AdamW, StateRestoreContinuesIdentically) {
  OptimizerConfig c;
  Param a = make_param("a", {1.0f, 2.0f, 3.0f}, {0.3f, -0.1f, 0.2f});
  Param b = make_param("b", {1.0f, 2.0f, 3.0f}, {0.3f, -0.1f, 0.2f});
  AdamW oa({&a}, c), ob({&b}, c);
  oa.step(1e-2f);
  oa.step(1e-2f);
  // "Checkpoint" oa into ob, then both take a third step.
  ob.load_state(oa.exp_avg(), oa.exp_avg_sq(), oa.step_count());
  b.value = a.value;
  oa.step(5e-3f);
  ob.step(5e-3f);
  EXPECT_EQ(ob.step_count(), 3);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(a.value[i], b.value[i]);
  // Wrong shapes or counts are a corrupt checkpoint.
  try {
    ob.load_state({Tensor({4})}, {Tensor({3})}, 1);
    FAIL() << "accepted a wrong shape";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_NE(std::string(e.what()).find("param b"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ob.load_state({}, {}, 1), Error);
  EXPECT_THROW(ob.load_state({Tensor({3})}, {Tensor({3})}, -1), Error);
}

TEST(LrSchedule, WarmupThenCosineEndpoints) {
  OptimizerConfig c;
  c.lr = 1e-3f;
  c.min_lr = 1e-4f;
  c.warmup_iters = 10;
  c.decay_iters = 110;
  EXPECT_EQ(lr_at(c, 0), 0.0f);  // Megatron: warmup starts from 0
  EXPECT_FLOAT_EQ(lr_at(c, 5), 0.5e-3f);
  EXPECT_FLOAT_EQ(lr_at(c, 10), 1e-3f);     // peak at the end of warmup
  EXPECT_FLOAT_EQ(lr_at(c, 60), 0.55e-3f);  // halfway through the decay: (lr + min_lr)/2
  const double q = 1e-4 + 0.9e-3 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25));
  EXPECT_NEAR(lr_at(c, 35), q, 1e-9);
  EXPECT_FLOAT_EQ(lr_at(c, 110), 1e-4f);
  EXPECT_FLOAT_EQ(lr_at(c, 1000), 1e-4f);  // stays at the floor
  for (int64_t it = 11; it <= 110; ++it) EXPECT_LE(lr_at(c, it), lr_at(c, it - 1)) << it;
  for (int64_t it = 1; it <= 10; ++it) EXPECT_GT(lr_at(c, it), lr_at(c, it - 1)) << it;
}

TEST(LrSchedule, NoWarmupAndDegenerateDecay) {
  OptimizerConfig c;
  c.lr = 2e-3f;
  c.min_lr = 2e-4f;
  c.warmup_iters = 0;
  c.decay_iters = 4;
  EXPECT_FLOAT_EQ(lr_at(c, 0), 2e-3f);
  EXPECT_FLOAT_EQ(lr_at(c, 4), 2e-4f);
  c.warmup_iters = 4;  // warmup == decay: ramp, then straight to min_lr
  EXPECT_FLOAT_EQ(lr_at(c, 4), 2e-3f);
  EXPECT_FLOAT_EQ(lr_at(c, 5), 2e-4f);
  c.warmup_iters = 0;
  c.decay_iters = 0;
  EXPECT_FLOAT_EQ(lr_at(c, 0), 2e-4f);  // no warmup, no decay phase: min_lr (set min_lr = lr for constant)
  c.min_lr = c.lr;
  EXPECT_FLOAT_EQ(lr_at(c, 7), 2e-3f);
}

// Megatron's OptimizerParamScheduler.get_lr for the other decay styles (W = 10, D = 110, lr 1e-3, min_lr 1e-4).
TEST(LrSchedule, MegatronDecayStyles) {
  OptimizerConfig c;
  c.lr = 1e-3f;
  c.min_lr = 1e-4f;
  c.warmup_iters = 10;
  c.decay_iters = 110;
  c.decay_style = LrDecayStyle::kLinear;
  EXPECT_FLOAT_EQ(lr_at(c, 60), 0.55e-3f);  // halfway: coeff 1/2
  EXPECT_FLOAT_EQ(lr_at(c, 35), static_cast<float>(1e-4 + 0.9e-3 * 0.75));
  EXPECT_FLOAT_EQ(lr_at(c, 110), 1e-4f);
  c.decay_style = LrDecayStyle::kConstant;  // after warmup, lr forever (also past D)
  EXPECT_FLOAT_EQ(lr_at(c, 5), 0.5e-3f);
  EXPECT_FLOAT_EQ(lr_at(c, 500), 1e-3f);
  c.decay_style = LrDecayStyle::kInverseSquareRoot;  // lr · √W / √it, floored at min_lr
  EXPECT_FLOAT_EQ(lr_at(c, 40), static_cast<float>(1e-3 * std::sqrt(10.0) / std::sqrt(40.0)));
  EXPECT_FLOAT_EQ(lr_at(c, 111), 1e-4f);
  c.decay_style = LrDecayStyle::kWsd;  // stable at lr until the last 20 steps, then anneal
  c.wsd_decay_iters = 20;
  EXPECT_FLOAT_EQ(lr_at(c, 90), 1e-3f);
  c.wsd_style = WsdDecayStyle::kExponential;
  EXPECT_FLOAT_EQ(lr_at(c, 100), static_cast<float>(1e-4 + 0.9e-3 * (2 * std::pow(0.5, 0.5) - 1)));
  c.wsd_style = WsdDecayStyle::kLinear;
  EXPECT_FLOAT_EQ(lr_at(c, 100), 0.55e-3f);
  c.wsd_style = WsdDecayStyle::kMinusSqrt;
  EXPECT_FLOAT_EQ(lr_at(c, 95), static_cast<float>(1e-4 + 0.9e-3 * (1 - std::sqrt(0.25))));
  c.wsd_style = WsdDecayStyle::kCosine;
  EXPECT_FLOAT_EQ(lr_at(c, 110), 1e-4f);
}

// --lr-warmup-init and a fractional warmup (--lr-warmup-fraction 0.05 of D = 110: W = 5.5, not rounded).
TEST(LrSchedule, WarmupInitAndFraction) {
  OptimizerConfig c;
  c.lr = 1e-3f;
  c.min_lr = 0;
  c.init_lr = 1e-4f;
  c.warmup_iters = 5.5;
  c.decay_iters = 110;
  EXPECT_FLOAT_EQ(lr_at(c, 0), 1e-4f);
  EXPECT_FLOAT_EQ(lr_at(c, 5), static_cast<float>(1e-4 + 0.9e-3 * 5 / 5.5));
  EXPECT_LT(lr_at(c, 6), 1e-3f);  // already decaying
  EXPECT_EQ(parse_lr_decay_style("WSD"), LrDecayStyle::kWsd);
  EXPECT_EQ(parse_wsd_decay_style("minus_sqrt"), WsdDecayStyle::kMinusSqrt);
  EXPECT_THROW(parse_lr_decay_style("exponential"), Error);
  c.decay_style = LrDecayStyle::kWsd;  // WSD without its anneal length
  EXPECT_THROW(validate(c), Error);
}

TEST(ClipScale, Factor) {
  EXPECT_EQ(clip_scale(0.5, 1.0f), 1.0f);
  EXPECT_EQ(clip_scale(0.0, 1.0f), 1.0f);
  EXPECT_FLOAT_EQ(clip_scale(4.0, 1.0f), static_cast<float>(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(clip_scale(1e6, 0.0f), 1.0f);  // clipping disabled
  EXPECT_TRUE(std::isnan(clip_scale(std::numeric_limits<double>::infinity(), 1.0f)));
  EXPECT_TRUE(std::isnan(clip_scale(std::numeric_limits<double>::quiet_NaN(), 1.0f)));
}

TEST(SumSquares, Fp64Accumulation) {
  Tensor t({2, 3});
  for (int64_t i = 0; i < 6; ++i) t[i] = static_cast<float>(i) - 2.0f;  // -2..3
  EXPECT_DOUBLE_EQ(sum_squares(t), 4 + 1 + 0 + 1 + 4 + 9);
}

}  // namespace
}  // namespace coc
