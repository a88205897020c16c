// Correlation id -> first event with that id (HTA's index_correlation), as a sorted vector: 16 bytes per entry
// and no node allocations, where an unordered_map would cost ~3x the memory on million-event traces.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace coc::analysis::detail {

class CorrIndex {
 public:
  template <typename Event>
  explicit CorrIndex(const std::vector<Event>& events) {
    pairs_.reserve(events.size());
    for (size_t i = 0; i < events.size(); ++i)
      if (events[i].corr != -1) pairs_.emplace_back(events[i].corr, static_cast<uint32_t>(i));
    std::sort(pairs_.begin(), pairs_.end());  // ties by index: lower_bound finds the first occurrence
  }
  /// Index of the first event with `corr`, or -1.
  int64_t find(int64_t corr) const {
    if (corr == -1) return -1;
    auto it = std::lower_bound(pairs_.begin(), pairs_.end(), std::pair<int64_t, uint32_t>(corr, 0));
    return it != pairs_.end() && it->first == corr ? static_cast<int64_t>(it->second) : -1;
  }

 private:
  std::vector<std::pair<int64_t, uint32_t>> pairs_;
};

}  // namespace coc::analysis::detail
