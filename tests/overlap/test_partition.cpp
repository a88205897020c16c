// split_rows and ChunkPlan (include/coc/overlap/partition.h): every row lands in exactly one piece, pieces differ
// by at most one row, and the chunk plan's sub-blocks tile each rank's share in order. Plain single-process test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "coc/core/error.h"
#include "coc/overlap/partition.h"

namespace coc {
namespace {

TEST(SplitRows, PiecesTileTheRangeAndDifferByAtMostOne) {
  for (int64_t total = 0; total <= 40; ++total)
    for (int64_t parts = 1; parts <= 12; ++parts) {
      int64_t next = 0, lo = INT64_MAX, hi = 0;
      for (int64_t i = 0; i < parts; ++i) {
        RowRange r = split_rows(total, parts, i);
        EXPECT_EQ(r.begin, next) << total << "/" << parts << " piece " << i;
        EXPECT_GE(r.count, 0);
        // The first total mod parts pieces are the long ones.
        EXPECT_EQ(r.count, total / parts + (i < total % parts ? 1 : 0));
        next = r.end();
        lo = std::min(lo, r.count);
        hi = std::max(hi, r.count);
      }
      EXPECT_EQ(next, total);
      EXPECT_LE(hi - lo, 1);
    }
}

TEST(SplitRows, KnownValues) {
  // m = 4097 over tp = 2: rank 0 gets the extra row (the error messages of the ops quote this split).
  EXPECT_EQ(split_rows(4097, 2, 0).count, 2049);
  EXPECT_EQ(split_rows(4097, 2, 1).begin, 2049);
  EXPECT_EQ(split_rows(4097, 2, 1).count, 2048);
  // Fewer rows than parts: trailing pieces are empty, and sit at the end.
  EXPECT_EQ(split_rows(3, 4, 3).count, 0);
  EXPECT_EQ(split_rows(3, 4, 3).begin, 3);
  EXPECT_EQ(split_rows(0, 3, 1).count, 0);
}

TEST(SplitRows, BadArgumentsAreInternalErrors) {
  EXPECT_THROW(split_rows(10, 0, 0), Error);
  EXPECT_THROW(split_rows(10, 3, 3), Error);
  EXPECT_THROW(split_rows(10, 3, -1), Error);
  EXPECT_THROW(split_rows(-1, 3, 0), Error);
  try {
    split_rows(10, 0, 0);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
  }
}

TEST(ChunkPlan, SubBlocksTileEveryShareInChunkOrder) {
  for (int64_t m = 0; m <= 37; ++m)
    for (int tp = 1; tp <= 5; ++tp)
      for (int n = 1; n <= 9; ++n) {
        ChunkPlan plan(m, tp, n);
        SCOPED_TRACE(::testing::Message() << "m=" << m << " tp=" << tp << " N=" << n);
        EXPECT_EQ(plan.m(), m);
        EXPECT_EQ(plan.tp(), tp);
        EXPECT_EQ(plan.requested_chunks(), n);
        // Empty chunks are dropped: as many chunks as rank 0's (the largest) share has rows, at most N.
        const int64_t biggest = split_rows(m, tp, 0).count;
        EXPECT_EQ(plan.chunks(), static_cast<int>(std::min<int64_t>(n, biggest)));
        std::vector<int> seen(static_cast<size_t>(m), 0);
        int64_t total = 0;
        for (int r = 0; r < tp; ++r) {
          RowRange share = plan.share(r);
          EXPECT_EQ(share.begin, split_rows(m, tp, r).begin);
          int64_t next = share.begin;
          for (int c = 0; c < plan.chunks(); ++c) {
            RowRange s = plan.sub(r, c);
            EXPECT_EQ(s.begin, next) << "rank " << r << " chunk " << c;  // contiguous, in chunk order
            next = s.end();
            for (int64_t i = s.begin; i < s.end(); ++i) seen[static_cast<size_t>(i)]++;
          }
          EXPECT_EQ(next, share.end()) << "rank " << r;
        }
        for (int c = 0; c < plan.chunks(); ++c) {
          EXPECT_GT(plan.chunk_rows(c), 0) << "chunk " << c << " is empty";
          total += plan.chunk_rows(c);
        }
        EXPECT_EQ(total, m);
        for (int64_t i = 0; i < m; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], 1) << "row " << i;
      }
}

TEST(ChunkPlan, LastRowsFirstVisitsTheSameChunksBackwards) {
  for (int64_t m = 0; m <= 37; ++m)
    for (int tp = 1; tp <= 5; ++tp)
      for (int n = 1; n <= 9; ++n) {
        const ChunkPlan fwd(m, tp, n), bwd(m, tp, n, /*last_rows_first=*/true);
        SCOPED_TRACE(::testing::Message() << "m=" << m << " tp=" << tp << " N=" << n);
        ASSERT_EQ(bwd.chunks(), fwd.chunks());
        const int C = fwd.chunks();
        for (int c = 0; c < C; ++c) {
          EXPECT_EQ(bwd.chunk_rows(c), fwd.chunk_rows(C - 1 - c));
          for (int r = 0; r < tp; ++r) {
            EXPECT_EQ(bwd.sub(r, c).begin, fwd.sub(r, C - 1 - c).begin) << "rank " << r << " chunk " << c;
            EXPECT_EQ(bwd.sub(r, c).count, fwd.sub(r, C - 1 - c).count) << "rank " << r << " chunk " << c;
          }
        }
        for (int c = 0; c < (tp == 1 ? C : 0); ++c) EXPECT_EQ(bwd.contiguous(c).begin, fwd.contiguous(C - 1 - c).begin);
      }
}

TEST(ChunkPlan, ContiguousViewForTheAllReduce) {
  // tp = 1 plan: chunks are contiguous blocks of m, identical to sub(0, c).
  for (int64_t m = 1; m <= 30; ++m)
    for (int n = 1; n <= 9; ++n) {
      ChunkPlan plan(m, 1, n);
      int64_t next = 0;
      for (int c = 0; c < plan.chunks(); ++c) {
        RowRange r = plan.contiguous(c);
        EXPECT_EQ(r.begin, next);
        EXPECT_GT(r.count, 0);
        EXPECT_EQ(r.begin, plan.sub(0, c).begin);
        EXPECT_EQ(r.count, plan.sub(0, c).count);
        next = r.end();
      }
      EXPECT_EQ(next, m);
    }
}

TEST(ChunkPlan, UnevenExample) {
  // m = 10 over tp = 3 (shares 4, 3, 3) in N = 2 chunks: chunk 0 = rows {0,1} ∪ {4,5} ∪ {7,8}.
  ChunkPlan plan(10, 3, 2);
  ASSERT_EQ(plan.chunks(), 2);
  EXPECT_EQ(plan.sub(0, 0).begin, 0);
  EXPECT_EQ(plan.sub(0, 0).count, 2);
  EXPECT_EQ(plan.sub(1, 0).begin, 4);
  EXPECT_EQ(plan.sub(1, 0).count, 2);
  EXPECT_EQ(plan.sub(2, 0).begin, 7);
  EXPECT_EQ(plan.sub(2, 0).count, 2);
  EXPECT_EQ(plan.sub(1, 1).begin, 6);
  EXPECT_EQ(plan.sub(1, 1).count, 1);
  EXPECT_EQ(plan.chunk_rows(0), 6);
  EXPECT_EQ(plan.chunk_rows(1), 4);
}

TEST(ChunkPlan, BadArgumentsAreInternalErrors) {
  EXPECT_THROW(ChunkPlan(10, 0, 2), Error);
  EXPECT_THROW(ChunkPlan(10, 2, 0), Error);
  EXPECT_THROW(ChunkPlan(-1, 2, 2), Error);
}

}  // namespace
}  // namespace coc
