// A trainable parameter shard: the local slice of one weight, its fp32 gradient (the "master gradient" that
// micro-batches accumulate into) and its placement on the mesh, so that the optimizer, gradient clipping, the
// gradient synchronisation and checkpoints treat it right.
#pragma once

#include <string>
#include <vector>

#include "coc/core/tensor.h"
#include "coc/parallel/placement.h"

namespace coc {

struct Param {
  std::string name;        ///< "layers.3.attention.qkv.weight" (stable: used in checkpoints and logs)
  Tensor value;            ///< local shard
  Tensor grad;             ///< same shape as value; accumulated over micro-batches, zeroed by the trainer
  /// How the tensor is split over the mesh and where its gradient is reduced (placement.h).
  Placement placement;
  bool weight_decay = true;  ///< false for norms and biases
  /// False for a frozen weight: backward computes no gradient for it (and, under --use-mc2, the column layer's dX
  /// then runs the fused matmul_reduce_scatter, since there is no dW GEMM left to overlap; docs/semantics.md §3).
  bool requires_grad = true;
};

using ParamList = std::vector<Param*>;

}  // namespace coc
