// The "Overlap Analysis" lanes of one rank (analysis/trace_writer.h): per step window W, C = union of compute
// events, M = union of collectives; Computing = C∩W, Communication = M∩W, Communication(Not Overlapped) =
// (M\C)∩W, Free = W\(C∪M) (docs/semantics.md §7, Ascend msprof's lane definitions). The same IntervalSet algebra
// serves `coc analyze`, so the lanes written here and the totals it reads back agree to the ns.
#include <fmt/format.h>

#include <algorithm>
#include <string_view>

#include "coc/analysis/trace_writer.h"

namespace coc::analysis {

namespace {
std::string step_name(const trace::Record& r) {
  for (int i = 0; i < r.nargs; ++i)
    if (std::string_view(r.args[i].key) == "iteration") return fmt::format("ProfilerStep#{}", r.args[i].value);
  return r.name;
}
}  // namespace

OverlapLanes overlap_lanes(const std::vector<trace::Record>& records, int64_t shift_ns) {
  std::vector<Interval> compute, comm, host_work;
  std::vector<int64_t> timing_begins;  // auto's timings of candidates (trace::kAutoTimingEvent)
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  OverlapLanes out;
  for (const trace::Record& r : records) {
    const Interval iv{r.begin_ns - shift_ns, r.end_ns - shift_ns};
    lo = std::min(lo, iv.begin);
    hi = std::max(hi, iv.end);
    if (r.cat == trace::Cat::kCompute) compute.push_back(iv);
    else if (r.cat == trace::Cat::kComm) comm.push_back(iv);
    else if (r.cat == trace::Cat::kHostWork) host_work.push_back(iv);
    else if (r.cat == trace::Cat::kStep) out.steps.push_back({step_name(r), iv, {}});
    else if (r.cat == trace::Cat::kHost && std::string_view(r.name) == trace::kAutoTimingEvent)
      timing_begins.push_back(iv.begin);
  }
  if (records.empty()) return out;
  if (out.steps.empty()) out.steps.push_back({"whole trace", Interval{lo, hi}, {}});
  std::sort(out.steps.begin(), out.steps.end(),
            [](const OverlapLanes::Step& a, const OverlapLanes::Step& b) { return a.window.begin < b.window.begin; });
  const IntervalSet C = IntervalSet::from_union(std::move(compute));
  const IntervalSet M = IntervalSet::from_union(std::move(comm));
  const IntervalSet busy = C.unite(M), exposed = M.subtract(C);
  std::vector<Interval> windows;
  for (OverlapLanes::Step& s : out.steps) {
    s.split = overlap_breakdown(C, M, s.window);
    s.auto_timing = std::any_of(timing_begins.begin(), timing_begins.end(),
                                [&](int64_t t) { return s.window.begin <= t && t < s.window.end; });
    out.total += s.split;
    if (!s.auto_timing) out.steady += s.split;
    windows.push_back(s.window);
  }
  // Steps never overlap (one training loop), but the union keeps the lanes well-formed if a caller's do.
  const IntervalSet W = IntervalSet::from_union(std::move(windows));
  out.computing = C.intersect(W);
  out.communication = M.intersect(W);
  out.exposed = exposed.intersect(W);
  out.free = W.subtract(busy);
  out.host_work_free = IntervalSet::from_union(std::move(host_work)).intersect(out.free).measure();
  return out;
}

}  // namespace coc::analysis
