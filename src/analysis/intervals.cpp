#include "coc/analysis/intervals.h"

#include <algorithm>

namespace coc::analysis {

IntervalSet IntervalSet::from_union(std::vector<Interval> raw) {
  std::erase_if(raw, [](const Interval& i) { return i.end <= i.begin; });
  std::sort(raw.begin(), raw.end(), [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  IntervalSet s;
  for (const Interval& i : raw) {
    if (!s.parts_.empty() && i.begin <= s.parts_.back().end) {
      s.parts_.back().end = std::max(s.parts_.back().end, i.end);
    } else {
      s.parts_.push_back(i);
    }
  }
  return s;
}

int64_t IntervalSet::measure() const {
  int64_t total = 0;
  for (const Interval& i : parts_) total += i.length();
  return total;
}

IntervalSet IntervalSet::unite(const IntervalSet& o) const {
  std::vector<Interval> all(parts_);
  all.insert(all.end(), o.parts_.begin(), o.parts_.end());
  return from_union(std::move(all));
}

IntervalSet IntervalSet::intersect(const IntervalSet& o) const {
  IntervalSet out;
  size_t i = 0, j = 0;
  while (i < parts_.size() && j < o.parts_.size()) {
    const int64_t b = std::max(parts_[i].begin, o.parts_[j].begin);
    const int64_t e = std::min(parts_[i].end, o.parts_[j].end);
    if (b < e) out.parts_.push_back({b, e});
    // Advance whichever interval ends first; the other may still meet the next one.
    if (parts_[i].end < o.parts_[j].end) ++i; else ++j;
  }
  return out;
}

IntervalSet IntervalSet::subtract(const IntervalSet& o) const {
  IntervalSet out;
  size_t j = 0;
  for (Interval cur : parts_) {
    while (j < o.parts_.size() && o.parts_[j].end <= cur.begin) ++j;
    size_t k = j;
    while (k < o.parts_.size() && o.parts_[k].begin < cur.end) {
      if (o.parts_[k].begin > cur.begin) out.parts_.push_back({cur.begin, o.parts_[k].begin});
      cur.begin = std::max(cur.begin, o.parts_[k].end);
      if (cur.begin >= cur.end) break;
      ++k;
    }
    if (cur.begin < cur.end) out.parts_.push_back(cur);
  }
  return out;
}

IntervalSet IntervalSet::clip(Interval w) const {
  IntervalSet win;
  if (w.end > w.begin) win.parts_.push_back(w);
  return intersect(win);
}

OverlapBreakdown overlap_breakdown(const IntervalSet& compute, const IntervalSet& comm, Interval window) {
  const IntervalSet c = compute.clip(window);
  const IntervalSet m = comm.clip(window);
  OverlapBreakdown b;
  b.window = window.length();
  b.computing = c.measure();
  b.communication = m.measure();
  b.overlapped = c.intersect(m).measure();
  b.exposed = b.communication - b.overlapped;
  b.free = b.window - b.computing - b.exposed;
  return b;
}

}  // namespace coc::analysis
