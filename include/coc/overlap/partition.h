// Even splits of a row count, used everywhere a tensor is cut across ranks or chunks.
//
// split(total, parts, i) gives part i of `total` rows cut into `parts` pieces whose sizes differ by at most one,
// the first (total mod parts) pieces being one row longer. So any m >= 1 works with any N >= 1 and any tp
// (docs/semantics.md §1, "The result equals N = 1"); some pieces are empty when total < parts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace coc {

struct RowRange {
  int64_t begin = 0;
  int64_t count = 0;
  int64_t end() const { return begin + count; }
};

/// Part `i` of `total` rows split into `parts` (parts >= 1, 0 <= i < parts).
RowRange split_rows(int64_t total, int64_t parts, int64_t i);

/// The row plan of a CoC op over a TP group of size T with N chunks, for m rows of the full (rank-major) matrix.
/// Rank r's share is split_rows(m, T, r); chunk i takes sub-block i of every rank's share:
/// sub(r, i) = split_rows(share_r.count, N, i), shifted by share_r.begin. Chunk i of the full matrix is therefore
/// the union over r of sub(r, i): contiguous per rank, rank-major within the chunk. Reading chunks this way is the
/// "row order" of docs/semantics.md §1 (MindSpeed's [N,T,p] ↔ [T,N,p] transpose), done through MPI displacements
/// instead of a copy. Chunks in which every sub-block is empty are dropped, so `chunks()` <= N.
/// `last_rows_first` numbers the chunks from the other end: chunk 0 is then sub-block N-1 of every share, for ops
/// whose input rows are produced from the last row down (CocOptions::last_rows_first).
class ChunkPlan {
 public:
  ChunkPlan(int64_t m, int tp, int n_chunks, bool last_rows_first = false);
  int64_t m() const { return m_; }
  int tp() const { return tp_; }
  int chunks() const { return static_cast<int>(chunk_ids_.size()); }
  int requested_chunks() const { return n_; }
  /// Rank r's share of the m rows.
  RowRange share(int r) const { return split_rows(m_, tp_, r); }
  /// Rows of rank r's share that belong to chunk c (0 <= c < chunks()), as rows of the full matrix.
  RowRange sub(int r, int c) const;
  /// Total rows of chunk c over all ranks.
  int64_t chunk_rows(int c) const;
  /// Rows [begin, end) of chunk c when the chunk is one contiguous block of the full matrix (T = 1 view used by
  /// matmul_all_reduce, where the whole m is chunked without a rank split).
  RowRange contiguous(int c) const { return split_rows(m_, n_, chunk_ids_[static_cast<size_t>(c)]); }

 private:
  int64_t m_;
  int tp_;
  int n_;
  std::vector<int> chunk_ids_;  // non-empty chunk indices in [0, n_)
};

}  // namespace coc
