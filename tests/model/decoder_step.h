// What the model tests compare: one forward and backward of a decoder on a fixed micro-batch, and its results.
#pragma once

#include <cstdint>
#include <vector>

#include "coc/model/decoder.h"

namespace coc::test {

/// The loss of one micro-batch and every gradient, in params() order.
struct Step {
  double loss = 0;
  std::vector<float> grads;
};

/// One forward and backward of `model` over `batch` fixed sequences (token ids (37·i + 11) mod 256, targets
/// (53·i + 5) mod 256), loss scale 0.5, gradients zeroed first.
inline Step decoder_step(Decoder& model, int64_t batch) {
  const int64_t m = model.config().seq_length * batch;
  std::vector<int32_t> tokens, targets;
  for (int64_t i = 0; i < m; ++i) {
    tokens.push_back(static_cast<int32_t>((i * 37 + 11) % 256));
    targets.push_back(static_cast<int32_t>((i * 53 + 5) % 256));
  }
  for (Param* p : model.params()) p->grad.zero();
  Step s;
  s.loss = model.forward(tokens.data(), targets.data(), batch);
  model.backward(0.5f);
  for (Param* p : model.params()) s.grads.insert(s.grads.end(), p->grad.data(), p->grad.data() + p->grad.numel());
  return s;
}

}  // namespace coc::test
