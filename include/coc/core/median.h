// The median of a set of timings: the statistic of every benchmark figure and of the automatic schedule choice
// (docs/performance.md: medians, not minima or means, on machines whose speed drifts).
#pragma once

#include <algorithm>
#include <vector>

namespace coc {

/// Median of `v` (any unit; taken by value and sorted): the middle element, or the mean of the two middle ones for
/// an even count; 0 for an empty set.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

}  // namespace coc
