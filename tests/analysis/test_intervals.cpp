#include <gtest/gtest.h>

#include "coc/analysis/intervals.h"

using coc::analysis::Interval;
using coc::analysis::IntervalSet;

TEST(Intervals, UnionMergesOverlapsAndDropsNegative) {
  auto s = IntervalSet::from_union({{10, 20}, {15, 30}, {40, 35}, {30, 31}, {50, 60}});
  ASSERT_EQ(s.parts().size(), 2u);
  EXPECT_EQ(s.measure(), 21 + 10);
}

TEST(Intervals, IntersectSubtractClip) {
  auto a = IntervalSet::from_union({{0, 10}, {20, 30}});
  auto b = IntervalSet::from_union({{5, 25}});
  EXPECT_EQ(a.intersect(b).measure(), 10);
  EXPECT_EQ(a.subtract(b).measure(), 10);
  EXPECT_EQ(b.subtract(a).measure(), 10);
  EXPECT_EQ(a.clip({8, 22}).measure(), 4);
}

TEST(Intervals, BreakdownSumsToWindow) {
  auto c = IntervalSet::from_union({{0, 50}});
  auto m = IntervalSet::from_union({{40, 70}});
  auto b = coc::analysis::overlap_breakdown(c, m, {0, 100});
  EXPECT_EQ(b.computing, 50);
  EXPECT_EQ(b.communication, 30);
  EXPECT_EQ(b.overlapped, 10);
  EXPECT_EQ(b.exposed, 20);
  EXPECT_EQ(b.free, 30);
  EXPECT_EQ(b.computing + b.exposed + b.free, b.window);
  EXPECT_NEAR(b.overlap_pct(), 100.0 / 3, 1e-9);
}
