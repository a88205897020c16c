// Parameter initialisation shared by the decoder and its layers (internal to src/model). Every weight element is
// drawn from init_normal keyed by (seed, parameter name, element index of the full weight), so a shard draws exactly
// its elements of the full matrix, whatever the tp size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coc/parallel/param.h"

namespace coc::model_init {

/// The key init_normal takes for a parameter name (FNV-1a).
uint64_t name_key(const std::string& s);
/// Fills a column-parallel shard [rows.size(), k]: local row i is row `rows[i]` of the full [n, k] weight `key`.
void init_rows(Param& p, const std::vector<int64_t>& rows, int64_t k, uint64_t seed, const std::string& key,
               float std);
/// Fills a row-parallel shard [n, k_r]: columns [begin, begin + k_r) of the full [n, k] weight `key`.
void init_cols(Param& p, int64_t k, int64_t begin, uint64_t seed, const std::string& key, float std);
/// An RMSNorm weight [h] of ones: whole on every TP rank; under SP it sees only this rank's sequence shard, so its
/// gradient is a partial sum over TP (Placement::tp_replicated).
Param make_norm(const std::string& name, int64_t h, bool sequence_parallel);

}  // namespace coc::model_init
