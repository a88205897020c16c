// Ascend traces: torch_npu / msprof trace_view.json. The top level is a JSON array; ts are decimal strings
// ("1704161511422904.204", µs); pids may exceed 2^32. Roles come from the process_name metadata:
//  - "Ascend Hardware": device tasks, classified by args["Task Type"] (event_classify.h);
//  - "HCCL" / "Communication": the collective ops (op level, names "hcom_allReduce__..."): communication;
//  - "Overlap Analysis": msprof's own lanes (threads Computing, Communication, Communication(Not Overlapped),
//    Free), kept apart as RankReport::vendor_overlap_lanes so our interval algebra can be checked against them;
//  - anything else is host side; "ProfilerStep#N" events delimit the steps.
// torch_npu links host and device through flow events, which are not kept: no launch statistics for Ascend.
#include "event_classify.h"
#include "trace_reader.h"

namespace coc::analysis::detail {

namespace {
int lane_of(const std::string& thread) {
  if (thread == "Computing") return 0;
  if (thread == "Communication") return 1;
  if (thread == "Communication(Not Overlapped)") return 2;
  if (thread == "Free") return 3;
  return -1;
}
}  // namespace

std::vector<RankTrace> build_ascend(const CollectedTrace& t, Convention conv) {
  RankTrace r;
  r.format = TraceFormat::kAscend;
  r.rank = t.dist_rank;
  for (const RawKept& e : t.events) {
    const int64_t b = kept_begin(e, conv), en = kept_end(e, conv);
    const std::string& name = t.names[e.name];
    auto pit = t.process_names.find(t.pid_of(e));
    const std::string& process = pit == t.process_names.end() ? t.names[0] : t.names[pit->second];
    if (process.rfind("Overlap Analysis", 0) == 0) {
      auto tit = t.thread_names.find(thread_key(t.pid_of(e), t.tid_of(e)));
      const int lane = tit == t.thread_names.end() ? -1 : lane_of(t.names[tit->second]);
      if (lane >= 0) {
        r.vendor_lanes[lane].push_back({b, en});
        r.has_vendor_lanes = true;
      }
      continue;
    }
    if (process.rfind("Ascend Hardware", 0) == 0 || process.rfind("HCCL", 0) == 0 ||
        process.rfind("Communication", 0) == 0) {
      const Kind kind =
          process.rfind("Ascend Hardware", 0) == 0 ? classify_ascend_task(name, t.names[e.extra]) : Kind::kComm;
      r.device.push_back({.ts = b, .end = en, .corr = e.corr, .stream = t.tid_of(e), .name = e.name, .kind = kind});
      continue;
    }
    if (name.rfind("ProfilerStep", 0) == 0) r.steps.push_back({b, en, e.name, false});
  }
  if (!r.device.empty()) r.notes.push_back("Ascend trace: no host-device links kept, so no launch statistics");
  std::vector<RankTrace> out;
  out.push_back(std::move(r));
  return out;
}

}  // namespace coc::analysis::detail
