// A trainable parameter shard: the local slice of one weight, its fp32 gradient (the "master gradient" that
// micro-batches accumulate into) and how it is split, so that the optimizer, gradient clipping, data-parallel
// reduction and checkpoints treat it right.
#pragma once

#include <string>
#include <vector>

#include "coc/core/tensor.h"

namespace coc {

struct Param {
  std::string name;        ///< "layers.3.attention.qkv.weight" (stable: used in checkpoints and logs)
  Tensor value;            ///< local shard
  Tensor grad;             ///< same shape as value; accumulated over micro-batches, zeroed by the trainer
  /// True when every TP rank holds the full, identical tensor (norm weights, row-layer bias). Its gradient is
  /// the same on every TP rank after the layer's own reduction, and grad-norm counts it once, not T times.
  bool tp_replicated = false;
  /// True when, with sequence parallelism, each TP rank sees only its sequence shard, so the gradient must be
  /// all-reduced over TP before the step (Megatron's `sequence_parallel` attribute on norm weights).
  bool sp_partial_grad = false;
  bool weight_decay = true;  ///< false for norms and biases
  /// False for a frozen weight: backward computes no gradient for it (and, under --use-mc2, the column layer's dX
  /// then runs the fused matmul_reduce_scatter, since there is no dW GEMM left to overlap; docs/semantics.md §3).
  bool requires_grad = true;
};

using ParamList = std::vector<Param*>;

}  // namespace coc
