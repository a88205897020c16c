// `coc check --op ring_attention`: ring attention over a cp group against full single-rank attention in fp64
// (output and the gradients dQ, dK, dV), on data every rank draws identically (consistency_data).
#pragma once

#include <cstdint>
#include <vector>

#include "coc/parallel/consistency.h"
#include "coc/parallel/ring_attention.h"

namespace coc {

/// One problem: S positions, B sequences, heads × D columns, the ring's options, and the data's seed.
struct RingAttentionCase {
  int64_t seq = 256, batch = 2, heads = 4, head_dim = 16;
  RingAttentionOptions opts;
  uint64_t seed = 7;
  /// Q, K, V and dO rounded to bf16 values (nearest even) before the run and the reference: what --bf16's layers
  /// pass, so that K and V blocks may travel in bf16 (RingAttentionOptions::kv_dtype) without changing a bit.
  bool bf16_values = false;
};

/// This rank's errors ("out", "dq", "dk", "dv": worst absolute error and its scale, the largest |reference|) and its
/// local results [2c·B, heads·D] each (for bitwise comparisons between runs).
struct RingAttentionCheck {
  ConsistencyResult errors;
  Tensor out, dq, dk, dv;
};

/// Runs forward and backward over `ring` (collective) and compares this rank's zig-zag rows with the fp64
/// attention of the whole sequence (computed on every rank, one query row at a time: no S×S matrix). Throws
/// check_ring_attention_sizes' errors, and kInvalidArgument for sizes < 1.
RingAttentionCheck check_ring_attention(const CpRing& ring, const RingAttentionCase& c);

}  // namespace coc
