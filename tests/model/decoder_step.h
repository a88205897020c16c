// What the model tests compare: one forward and backward of a decoder on a fixed micro-batch, and its results.
#pragma once

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdint>
#include <string>
#include <vector>

#include "coc/model/decoder.h"

namespace coc::test {

/// The loss of one micro-batch and every gradient, in params() order.
struct Step {
  double loss = 0;
  std::vector<float> grads;
};

/// `batch` fixed sequences for `model`: token ids (37·i + 11) mod 256, targets (53·i + 5) mod 256.
struct FixedBatch {
  std::vector<int32_t> tokens, targets;
  FixedBatch(const Decoder& model, int64_t batch) {
    for (int64_t i = 0; i < model.config().seq_length * batch; ++i) {
      tokens.push_back(static_cast<int32_t>((i * 37 + 11) % 256));
      targets.push_back(static_cast<int32_t>((i * 53 + 5) % 256));
    }
  }
};

/// This process's minor page faults so far (each first touch of a fresh page).
inline long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

/// reserve_activations' promise: the step after it (`step_faults`) faults in few pages against the reservation's
/// `reserve_faults`. Skipped where pages do not fault one by one (transparent huge pages, AddressSanitizer's
/// allocator). `what` names the step.
inline void expect_few_page_faults(long step_faults, long reserve_faults, const std::string& what) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's allocator: page faults are its own";
#else
  if (reserve_faults < 1000) GTEST_SKIP() << "reserve_activations faulted " << reserve_faults << " times (huge pages?)";
  EXPECT_LT(step_faults, reserve_faults / 8)
      << step_faults << " page faults in " << what << " after reserve_activations, which faulted " << reserve_faults;
#endif
}

/// Every gradient of `model`, in params() order.
inline std::vector<float> gradients(Decoder& model) {
  std::vector<float> g;
  for (Param* p : model.params()) g.insert(g.end(), p->grad.data(), p->grad.data() + p->grad.numel());
  return g;
}

/// One forward and backward of `model` over FixedBatch(model, batch), loss scale 0.5, gradients zeroed first.
inline Step decoder_step(Decoder& model, int64_t batch) {
  const FixedBatch b(model, batch);
  for (Param* p : model.params()) p->grad.zero();
  Step s;
  s.loss = model.forward(b.tokens.data(), b.targets.data(), batch);
  model.backward(0.5f);
  s.grads = gradients(model);
  return s;
}

}  // namespace coc::test
