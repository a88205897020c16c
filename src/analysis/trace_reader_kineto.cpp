// PyTorch/Kineto traces (2021 and current schemas). Roles, as HTA assigns them (hta/common/trace.py and
// trace_filter.py @ f4d0062c): an event whose args.stream is an integer other than -1 ran on a device
// (including the uint32 "-1" 4294967295 that some CUPTI versions write for sync records); events without a
// stream that carry args.correlation are host calls (cudaLaunchKernel, cudaMemcpyAsync, ...), linked to their
// device event by that id; "ProfilerStep#N" events delimit the steps. Legacy 2021 traces (capitalised
// categories Kernel / Memcpy / Runtime, string tids "stream 7", "external id") need nothing special here:
// roles never depend on the category spelling (edge cases 29 and 30 of docs/edge-cases.md).
#include <cstring>

#include "event_classify.h"
#include "trace_reader.h"

namespace coc::analysis::detail {

int64_t kept_begin(const RawKept& e, Convention conv) {
  return conv == Convention::kHta ? (floor_div(e.ts, 1000) + e.hta_begin_adj) * 1000 : e.ts;
}

int64_t kept_end(const RawKept& e, Convention conv) {
  return conv == Convention::kHta ? (floor_div(e.end, 1000) + e.hta_end_adj) * 1000 : e.end;
}

TraceFormat detect_format(const CollectedTrace& t) {
  if (t.top_level_array) {
    for (const auto& [pid, name] : t.process_names) {
      const std::string& p = t.names[name];
      if (p.rfind("Ascend", 0) == 0 || p.rfind("HCCL", 0) == 0 || p.rfind("Overlap Analysis", 0) == 0 ||
          p.rfind("Communication", 0) == 0 || p.rfind("CANN", 0) == 0)
        return TraceFormat::kAscend;
    }
    for (const RawKept& e : t.events)
      if (e.extra != 0) return TraceFormat::kAscend;  // a "Task Type": an Ascend task
    for (const RawKept& e : t.events)
      if (t.names[e.name].rfind("aten::", 0) == 0) return TraceFormat::kTorchCpu;
    return TraceFormat::kAscend;
  }
  if (t.coc_producer) return TraceFormat::kCoc;
  // otherData may come after traceEvents; coc's categories identify the file as well.
  for (const RawKept& e : t.events) {
    const std::string& c = t.names[e.cat];
    if (c == "overlap_analysis" || c == "compute" || c == "comm") return TraceFormat::kCoc;
  }
  if (!t.seen_device && !t.cpu_ops.empty()) return TraceFormat::kTorchCpu;
  return TraceFormat::kKineto;
}

std::vector<RankTrace> build_kineto(CollectedTrace& t, Convention conv) {
  RankTrace r;
  r.format = TraceFormat::kKineto;
  r.rank = t.dist_rank;
  size_t n_device = 0;
  for (const RawKept& e : t.events) n_device += e.has_stream && e.stream != -1;
  r.device.reserve(n_device);
  r.host.reserve(t.events.size() - n_device);
  for (; !t.events.empty(); t.events.pop_front()) {
    const RawKept& e = t.events.front();
    const std::string& name = t.names[e.name];
    const std::string& cat = t.names[e.cat];
    if (cat == "Trace") continue;  // HTA drops the profiler's own span
    const int64_t b = kept_begin(e, conv), en = kept_end(e, conv);
    if (e.has_stream && e.stream != -1) {
      r.device.push_back({.ts = b, .end = en, .corr = e.corr, .stream = e.stream, .name = e.name,
                          .kind = classify_device_event(name, cat, conv), .group = e.group});
      continue;
    }
    if (name.rfind("ProfilerStep", 0) == 0) {
      r.steps.push_back({b, en, e.name, cat == "gpu_user_annotation"});
      continue;
    }
    if (e.corr != -1) r.host.push_back({b, en, e.corr, e.name});
  }
  std::vector<RankTrace> out;
  out.push_back(std::move(r));
  return out;
}

}  // namespace coc::analysis::detail
