// The consistency check of the MoE layer (`coc check --layer moe` and tests/parallel/test_moe.cpp): the layer
// on the mesh's ep, dp-cp and expert-dp groups against a single-rank fp64 reference MoE of the whole global batch.
#pragma once

#include <cstdint>

#include "coc/comm/mesh.h"
#include "coc/parallel/consistency.h"
#include "coc/parallel/moe.h"

namespace coc {

struct MoeCheckCase {
  MoeConfig cfg;               ///< hidden, ffn_hidden, experts, top-k, dispatcher, router pattern, capacity, aux coeff
  int64_t tokens = 64;         ///< T, the global batch's tokens, split over dp-cp in contiguous shards
  bool empty_rank = false;     ///< dp-cp rank 0 holds no tokens (the others share them)
  uint64_t seed = 11;
};

/// Everything one check produced on this rank, for the tests' cross-layout comparisons.
struct MoeCheckResult {
  ConsistencyResult errors;      ///< "output", "aux loss", "dx", "router grad", "gate_up grad", "down grad"
  std::vector<float> gate_up_grad, down_grad;  ///< the FULL expert gradients (gathered over ep, summed over expert-dp)
  std::vector<float> router_grad;              ///< summed over dp-cp
  std::vector<float> output;                   ///< this rank's y rows
  double aux_loss = 0;
  std::vector<int64_t> local_expert_tokens;
};

/// Runs the case (collective over the world) and returns this rank's errors against the fp64 reference. Gradients
/// are those of L = Σ dY ⊙ Y + aux loss (dY drawn like X); the router's is summed over dp-cp and the experts' over
/// expert-dp before the comparison, so every rank compares the exact full gradient. Requires tp = cp = 1.
/// Throws check_moe_config's errors.
MoeCheckResult check_moe_layer(Mesh& mesh, const MoeCheckCase& c);

}  // namespace coc
