// coc's own traces (docs/profiling.md, written by coc train --profile): one process per rank (pid = rank),
// cat "compute" and "comm" complete events on the stream threads, cat "step" ProfilerStep#N windows, and per rank
// an "Overlap Analysis" process (pid = 1000000 + rank, cat "overlap_analysis", tid 0..3 = the four lanes) that
// the writer computed with the same interval algebra; it becomes RankReport::vendor_overlap_lanes. A merged file
// holds several ranks, so this builder returns one RankTrace per rank, sorted by rank.
#include <map>

#include "coc/runtime/tracer.h"
#include "trace_reader.h"

namespace coc::analysis::detail {

namespace {
constexpr int64_t kOverlapPidBase = 1000000;
}

std::vector<RankTrace> build_coc(const CollectedTrace& t, Convention conv) {
  std::map<int64_t, RankTrace> by_rank;
  auto rank_trace = [&](int64_t rank) -> RankTrace& {
    RankTrace& r = by_rank[rank];
    r.rank = static_cast<int>(rank);
    r.format = TraceFormat::kCoc;
    r.pp_stages = t.pp_stages;
    r.pp_micro_batches = t.pp_micro_batches;
    r.pp_virtual_stages = t.pp_virtual_stages;
    return r;
  };
  for (const RawKept& e : t.events) {
    const std::string& cat = t.names[e.cat];
    const int64_t b = kept_begin(e, conv), en = kept_end(e, conv);
    if (cat == "overlap_analysis") {
      if (t.pid_of(e) < kOverlapPidBase || t.tid_of(e) < 0 || t.tid_of(e) > 3) continue;
      RankTrace& r = rank_trace(t.pid_of(e) - kOverlapPidBase);
      r.vendor_lanes[t.tid_of(e)].push_back({b, en});
      r.has_vendor_lanes = true;
      continue;
    }
    if (t.pid_of(e) < 0 || t.pid_of(e) >= kOverlapPidBase) continue;
    if (cat == "compute" || cat == "comm") {
      rank_trace(t.pid_of(e)).device.push_back({.ts = b, .end = en, .corr = e.corr, .stream = t.tid_of(e),
                                                .name = e.name,
                                                .kind = cat == "compute" ? Kind::kCompute : Kind::kComm,
                                                .group = e.group, .op = cat == "comm" ? e.extra : 0,
                                                .collective = cat == "comm" ? e.collective : -1});
    } else if (cat == "step") {
      rank_trace(t.pid_of(e)).steps.push_back({b, en, e.name, false});
    } else if (cat == "host_work") {
      rank_trace(t.pid_of(e)).host_work.push_back({b, en, e.name});
    } else if (cat == "host" && t.names[e.name] == trace::kAutoTimingEvent) {
      rank_trace(t.pid_of(e)).auto_timing.push_back({b, en});
    }
  }
  // A single-rank file names its rank in distributedInfo even when pid says otherwise.
  std::vector<RankTrace> out;
  for (auto& [rank, r] : by_rank) out.push_back(std::move(r));
  if (out.size() == 1 && t.dist_rank >= 0) out[0].rank = t.dist_rank;
  return out;
}

}  // namespace coc::analysis::detail
