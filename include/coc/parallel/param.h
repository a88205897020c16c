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
  /// True when every read of `value` in training rounds it to the GEMM compute type first (kernels/gemm.h): it is
  /// only ever an operand of compute-type GEMMs (the linear layers', the experts' and the output layer's weights),
  /// or it is the embedding table, whose looked-up rows the decoder stores as the compute type (rounding twice
  /// gives the value of rounding once). A copy that holds only the rounded values then computes the same bits, so
  /// under --bf16 FSDP and ZeRO gather it in 2-byte elements (FsdpOptions::param_gather_dtype). False for what is
  /// read in fp32: the norms' weights, biases (added in fp32 before the output is rounded), the MoE router (an
  /// fp32 GEMM, GemmComputeScope). Set where the parameter is created, by the code that knows its readers; a new
  /// reader that needs the fp32 value (e.g. QuantizedRowParallelLinear quantizing its source layer, built only
  /// from an unsharded layer today) must not be handed a gathered copy.
  bool read_as_compute_type = false;
};

using ParamList = std::vector<Param*>;

}  // namespace coc
