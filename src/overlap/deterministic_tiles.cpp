// Deterministic GEMM tiling (coc_internal.h, TileSchedule): rows are always computed in the same GEMM calls,
// whatever the chunk count, so that deterministic mode is bitwise identical for every N (docs/design.md,
// "Deterministic mode"; ours: MindSpeed's deterministic lcoc only fixes the reduction order).
#include <algorithm>
#include <climits>
#include <utility>

#include "coc/core/error.h"
#include "coc_internal.h"

namespace coc::detail {

namespace {
int64_t tile_count(int64_t m) { return (m + kDeterministicTileRows - 1) / kDeterministicTileRows; }

/// First and last tile that rows `r` (count > 0) touch.
std::pair<int64_t, int64_t> tiles_of(RowRange r) {
  return {r.begin / kDeterministicTileRows, (r.end() - 1) / kDeterministicTileRows};
}

/// Per tile: `init` combined (min when `earliest`, else max) with the chunk index of every plan sub-block that
/// touches it, leaving out rank `skip`'s sub-blocks (-1: none).
std::vector<int> tile_chunks(const ChunkPlan& plan, int skip, int init, bool earliest) {
  std::vector<int> chunk(static_cast<size_t>(tile_count(plan.m())), init);
  for (int c = 0; c < plan.chunks(); ++c)
    for (int r = 0; r < plan.tp(); ++r) {
      const RowRange s = plan.sub(r, c);
      if (r == skip || s.count == 0) continue;
      const auto [first, last] = tiles_of(s);
      for (int64_t t = first; t <= last; ++t) {
        int& o = chunk[static_cast<size_t>(t)];
        o = earliest ? std::min(o, c) : std::max(o, c);
      }
    }
  return chunk;
}
}  // namespace

TileSchedule::TileSchedule(const ChunkPlan& plan, bool compute_first) : m_(plan.m()) {
  const std::vector<int> owner = tile_chunks(plan, -1, compute_first ? INT_MAX : -1, compute_first);
  by_chunk_.resize(static_cast<size_t>(plan.chunks()));
  for (int64_t t = 0; t < static_cast<int64_t>(owner.size()); ++t) {
    const int o = owner[static_cast<size_t>(t)];
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

TileCover::TileCover(int64_t m) : m_(m), done_(static_cast<size_t>(tile_count(m)), 0) {}

int64_t TileCover::cover(RowRange rows, ConstMatrixView x, ConstMatrixView w, WeightLayout layout, MatrixView y) {
  if (rows.count <= 0) return 0;
  int64_t computed = 0;
  const auto [first, last] = tiles_of(rows);
  for (int64_t t = first; t <= last; ++t) {
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
  // The communicate-first assignment of TileSchedule, with this rank's rows present before chunk 0 (-1).
  const std::vector<int> ready = tile_chunks(plan, me, -1, /*earliest=*/false);
  std::vector<std::vector<int64_t>> lists(static_cast<size_t>(plan.chunks()) + 1);
  for (int64_t t = 0; t < static_cast<int64_t>(ready.size()); ++t)
    lists[static_cast<size_t>(ready[static_cast<size_t>(t)] + 1)].push_back(t);
  return lists;
}

}  // namespace coc::detail
