// Deterministic GEMM tiling (coc_internal.h, TileSchedule): rows are always computed in the same GEMM calls,
// whatever the chunk count, so that deterministic mode is bitwise identical for every N (semantics.md §3,
// "Deterministic variants"; ours: MindSpeed's deterministic lcoc only fixes the reduction order).
#include <algorithm>
#include <climits>

#include "coc/core/error.h"
#include "coc_internal.h"

namespace coc::detail {

TileSchedule::TileSchedule(const ChunkPlan& plan, bool compute_first) : m_(plan.m()) {
  const int64_t tiles = (m_ + kDeterministicTileRows - 1) / kDeterministicTileRows;
  std::vector<int> owner(static_cast<size_t>(tiles), compute_first ? INT_MAX : -1);
  for (int c = 0; c < plan.chunks(); ++c)
    for (int r = 0; r < plan.tp(); ++r) {
      RowRange s = plan.sub(r, c);
      if (s.count == 0) continue;
      for (int64_t t = s.begin / kDeterministicTileRows; t <= (s.end() - 1) / kDeterministicTileRows; ++t) {
        int& o = owner[static_cast<size_t>(t)];
        o = compute_first ? std::min(o, c) : std::max(o, c);
      }
    }
  by_chunk_.resize(static_cast<size_t>(plan.chunks()));
  for (int64_t t = 0; t < tiles; ++t) {
    int o = owner[static_cast<size_t>(t)];
    COC_ASSERT(o >= 0 && o < plan.chunks(), "tile {} of m={} has no chunk", t, m_);
    by_chunk_[static_cast<size_t>(o)].push_back(t);
  }
}

RowRange tile_rows(int64_t t, int64_t m) {
  const int64_t b = t * kDeterministicTileRows;
  return {b, std::min(kDeterministicTileRows, m - b)};
}

RowRange TileSchedule::rows(int64_t t) const { return tile_rows(t, m_); }

int64_t gemm_tiles(const TileSchedule& ts, const std::vector<int64_t>& tiles, ConstMatrixView x, ConstMatrixView w,
                   WeightLayout layout, MatrixView y, const float* bias) {
  int64_t rows = 0;
  for (int64_t t : tiles) {
    RowRange r = ts.rows(t);
    MatrixView yt = y.slice_rows(r.begin, r.count);
    matmul(x.slice_rows(r.begin, r.count), w, layout, yt);
    if (bias) add_bias(yt, bias);
    rows += r.count;
  }
  return rows;
}

TileCover::TileCover(int64_t m)
    : m_(m), done_(static_cast<size_t>((m + kDeterministicTileRows - 1) / kDeterministicTileRows), 0) {}

int64_t TileCover::cover(RowRange rows, ConstMatrixView x, ConstMatrixView w, WeightLayout layout, MatrixView y) {
  if (rows.count <= 0) return 0;
  int64_t computed = 0;
  for (int64_t t = rows.begin / kDeterministicTileRows; t <= (rows.end() - 1) / kDeterministicTileRows; ++t) {
    char& done = done_[static_cast<size_t>(t)];
    if (done) continue;
    const RowRange r = tile_rows(t, m_);
    matmul(x.slice_rows(r.begin, r.count), w, layout, y.slice_rows(r.begin, r.count));
    done = 1;
    computed += r.count;
  }
  return computed;
}

std::vector<std::vector<int64_t>> ready_tiles(const ChunkPlan& plan, int me) {
  const int64_t tiles = (plan.m() + kDeterministicTileRows - 1) / kDeterministicTileRows;
  std::vector<int> ready(static_cast<size_t>(tiles), -1);  // -1: this rank's rows only
  for (int c = 0; c < plan.chunks(); ++c)
    for (int r = 0; r < plan.tp(); ++r) {
      const RowRange s = plan.sub(r, c);
      if (r == me || s.count == 0) continue;
      for (int64_t t = s.begin / kDeterministicTileRows; t <= (s.end() - 1) / kDeterministicTileRows; ++t)
        ready[static_cast<size_t>(t)] = std::max(ready[static_cast<size_t>(t)], c);
    }
  std::vector<std::vector<int64_t>> lists(static_cast<size_t>(plan.chunks()) + 1);
  for (int64_t t = 0; t < tiles; ++t) lists[static_cast<size_t>(ready[static_cast<size_t>(t)] + 1)].push_back(t);
  return lists;
}

}  // namespace coc::detail
