// `coc analyze --csv`: one row per rank and step, with the columns of msprof-analyze's cluster
// step_trace_time.csv (Ascend mstt, profiler/msprof_analyze/cluster_analyse: Step, Type, Index, Computing,
// Communication(Not Overlapped), Overlapped, Communication, Free, Stage, Bubble, Communication(Not Overlapped
// and Exclude Receive), Preparing), in µs, so that the tools that read that file read ours. Mapping:
//  - Type is always "rank" and Index the rank (no "stage" rows: a coc trace does not say which stage a rank is);
//  - Stage is the step window; Bubble is the pipeline bubble (StepReport::pp_bubble_ns: the stage's exposed waits
//    for a pp receive, msprof's receive time; 0 without pipelining), and "Exclude Receive" is Communication(Not
//    Overlapped) less it;
//  - Preparing is the time from the step start to the first computing or communication lane segment;
//  - Step is the step's number ("ProfilerStep#12" → 12), empty for a trace without steps.
#include <fmt/format.h>

#include <algorithm>

#include "coc/analysis/analyze.h"
#include "report_common.h"

namespace coc::analysis {

namespace {

int64_t preparing_ns(const RankReport& rk, const StepReport& s) {
  int64_t first = s.end_ns;
  for (const auto& seg : rk.lanes)
    if (seg.lane <= 1 && seg.end_ns > s.begin_ns && seg.begin_ns < s.end_ns)
      first = std::min(first, std::max(seg.begin_ns, s.begin_ns));
  return first - s.begin_ns;
}

void row(std::string& out, const std::string& step, const RankReport& rk, const StepReport& s) {
  const OverlapBreakdown& b = s.split;
  auto u = [](int64_t ns) { return fmt::format("{:.3f}", report::us(ns)); };
  out += fmt::format("{},rank,{},{},{},{},{},{},{},{},{},{}\n", step, rk.rank, u(b.computing), u(b.exposed),
                     u(b.overlapped), u(b.communication), u(b.free), u(b.window), u(s.pp_bubble_ns),
                     u(b.exposed - s.pp_bubble_ns), u(preparing_ns(rk, s)));
}

}  // namespace

std::string render_csv(const Report& r) {
  std::string out =
      "Step,Type,Index,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,Bubble,"
      "Communication(Not Overlapped and Exclude Receive),Preparing\n";
  for (const auto& rk : r.ranks) {
    if (rk.steps.empty()) {
      row(out, "", rk, rk.total);
      continue;
    }
    for (size_t i = 0; i < rk.steps.size(); ++i) row(out, report::step_number(rk.steps[i].name, i), rk, rk.steps[i]);
  }
  return out;
}

}  // namespace coc::analysis
