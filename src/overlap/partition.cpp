#include "coc/overlap/partition.h"

#include <algorithm>

#include "coc/core/error.h"

namespace coc {

RowRange split_rows(int64_t total, int64_t parts, int64_t i) {
  COC_ASSERT(parts >= 1 && i >= 0 && i < parts && total >= 0, "split_rows({}, {}, {})", total, parts, i);
  int64_t base = total / parts, rem = total % parts;
  return {i * base + std::min(i, rem), base + (i < rem ? 1 : 0)};
}

ChunkPlan::ChunkPlan(int64_t m, int tp, int n_chunks, bool last_rows_first) : m_(m), tp_(tp), n_(n_chunks) {
  COC_ASSERT(m >= 0 && tp >= 1 && n_chunks >= 1, "ChunkPlan({}, {}, {})", m, tp, n_chunks);
  // Chunk c is non-empty iff some rank's sub-block is; the largest share is rank 0's, so test that one (for the
  // contiguous view the same condition holds since m >= share(0)).
  int64_t biggest = split_rows(m, tp, 0).count;
  for (int c = 0; c < n_chunks; ++c)
    if (split_rows(biggest, n_chunks, c).count > 0) chunk_ids_.push_back(c);
  if (last_rows_first) std::reverse(chunk_ids_.begin(), chunk_ids_.end());
}

RowRange ChunkPlan::sub(int r, int c) const {
  RowRange s = share(r);
  RowRange part = split_rows(s.count, n_, chunk_ids_[static_cast<size_t>(c)]);
  return {s.begin + part.begin, part.count};
}

int64_t ChunkPlan::chunk_rows(int c) const {
  int64_t n = 0;
  for (int r = 0; r < tp_; ++r) n += sub(r, c).count;
  return n;
}

}  // namespace coc
