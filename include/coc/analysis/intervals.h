// Interval algebra on integer nanoseconds: the one primitive of the overlap analysis (docs/semantics.md §7).
//
// Times are int64 ns on one rank's clock. An IntervalSet is a sorted list of disjoint, non-empty half-open
// intervals [begin, end). Building a set from raw events takes their union, so overlapping events on one stream
// (edge case 23 of docs/edge-cases.md) count once and a duration is never negative (edge case 22: an event whose end
// precedes its begin is empty, not negative). All measures are in ns.
#pragma once

#include <cstdint>
#include <vector>

namespace coc::analysis {

/// [begin, end) in ns. Empty when end <= begin.
struct Interval {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t length() const { return end > begin ? end - begin : 0; }
};

/// A union of disjoint intervals, kept sorted. Cost: build O(n log n); set operations O(n + m).
class IntervalSet {
 public:
  IntervalSet() = default;
  /// The union of `raw` (any order, may overlap or be empty).
  static IntervalSet from_union(std::vector<Interval> raw);

  const std::vector<Interval>& parts() const { return parts_; }
  bool empty() const { return parts_.empty(); }
  /// Total covered length, ns.
  int64_t measure() const;

  IntervalSet unite(const IntervalSet& o) const;      ///< this ∪ o
  IntervalSet intersect(const IntervalSet& o) const;  ///< this ∩ o
  IntervalSet subtract(const IntervalSet& o) const;   ///< this \ o
  /// this ∩ [w.begin, w.end): intervals crossing the window are clipped, not dropped.
  IntervalSet clip(Interval w) const;

 private:
  std::vector<Interval> parts_;
};

/// The overlap analysis of one rank and one step window (docs/semantics.md §7; Ascend's "Overlap Analysis" lane):
/// C = compute union, M = communication union, W = window. All in ns.
struct OverlapBreakdown {
  int64_t window = 0;         ///< |W|
  int64_t computing = 0;      ///< |C ∩ W|
  int64_t communication = 0;  ///< |M ∩ W| (total communication, overlapped or not)
  int64_t overlapped = 0;     ///< |C ∩ M ∩ W|
  int64_t exposed = 0;        ///< |(M \ C) ∩ W|: Communication(Not Overlapped)
  int64_t free = 0;           ///< |W| − |(C ∪ M) ∩ W|
  /// HTA's comm/comp overlap: |C ∩ M| / |M| in percent; 0 when there is no communication.
  double overlap_pct() const { return communication > 0 ? 100.0 * overlapped / communication : 0.0; }
  /// Adds another window's figures (windows that do not overlap, such as steps).
  OverlapBreakdown& operator+=(const OverlapBreakdown& x) {
    window += x.window;
    computing += x.computing;
    communication += x.communication;
    overlapped += x.overlapped;
    exposed += x.exposed;
    free += x.free;
    return *this;
  }
};

/// Computes the breakdown of `compute` and `comm` (already unions) inside `window`. Invariant:
/// computing + exposed + free == window.
OverlapBreakdown overlap_breakdown(const IntervalSet& compute, const IntervalSet& comm, Interval window);

}  // namespace coc::analysis
