// HTA's figures, reproduced from Meta's Holistic Trace Analysis at commit f4d0062c (MIT):
//  - temporal breakdown (hta/analyzers/breakdown_analysis.py get_temporal_breakdown): over the device events
//    (stream != -1), kernel_time = last end − first start, idle = kernel_time − |union of all|,
//    compute = |union of COMPUTATION events|, non_compute = the rest of the busy time (memcpy, memset, sync,
//    communication);
//  - idle-time breakdown per stream (_analyze_idle_time_for_stream): gaps between consecutive events of the
//    stream (sorted by start, sync records excluded as at f4d0062c), "host wait" when the event's launch call
//    started after the previous event ended, "kernel wait" when the gap is under 30 µs, "other" otherwise;
//  - queue length (hta/analyzers/trace_counters.py): +1 at each launch call (cudaLaunchKernel[ExC],
//    cuLaunchKernel, cudaMemcpyAsync, cudaMemsetAsync and the hip equivalents), −1 when its device event starts,
//    cumulated per stream, summarised as pandas' describe() would (count, mean, median, max). Ties at the same
//    µs are ordered launch calls first; pandas' unstable sort orders them arbitrarily, so the mean may differ
//    from HTA's in the third decimal on traces with many ties;
//  - kernel launch statistics (hta/analyzers/cuda_kernel_analysis.py get_cuda_kernel_launch_stats): launch
//    delay = device start − (call start + call duration), counts of calls over 50 µs and delays over 100 µs,
//    and kernels shorter than their launch call.
// Times are ns; under Convention::kHta they are HTA's inward-rounded whole µs (× 1000).
#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "corr_index.h"
#include "metrics.h"

namespace coc::analysis::detail {

namespace {
constexpr int64_t kKernelWaitNs = 30'000;  // HTA consecutive_kernel_delay default: 30 µs
constexpr int64_t kCpuDurCutoffNs = 50'000, kLaunchDelayCutoffNs = 100'000;

bool is_queue_launch(const std::string& n) {
  return n == "cudaLaunchKernel" || n == "cudaLaunchKernelExC" || n == "cuLaunchKernel" || n == "cuLaunchKernelEx" ||
         n == "cudaMemcpyAsync" || n == "cudaMemsetAsync" || n == "hipLaunchKernel" ||
         n == "hipExtModuleLaunchKernel" || n == "hipMemcpyAsync" || n == "hipMemsetAsync" ||
         n == "hipMemcpyWithStream";
}

bool is_stats_launch(const std::string& n) {
  return n == "cudaLaunchKernel" || n == "cudaLaunchKernelExC" || n == "cudaMemcpyAsync" || n == "cudaMemsetAsync";
}

double median_of(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  const size_t n = v.size();
  std::nth_element(v.begin(), v.begin() + static_cast<long>(n / 2), v.end());
  const int64_t hi = v[n / 2];
  if (n % 2) return static_cast<double>(hi);
  const int64_t lo = *std::max_element(v.begin(), v.begin() + static_cast<long>(n / 2));
  return 0.5 * static_cast<double>(lo + hi);
}
}  // namespace

bool counts_as_busy(Kind k, Convention conv) {
  if (conv == Convention::kAscend) return k == Kind::kCompute || k == Kind::kComm || k == Kind::kOther;
  return true;
}

bool apply_hta_step_filter(RankTrace& rt, const NameTable& /*names*/) {
  std::set<uint32_t> distinct;
  for (const StepMarker& s : rt.steps) distinct.insert(s.name);
  if (distinct.size() < 2) return false;  // HTA: "only one iteration", nothing filtered
  int64_t last_start = rt.steps.front().ts;
  for (const StepMarker& s : rt.steps) last_start = std::max(last_start, s.ts);
  std::unordered_set<int64_t> kept_corr;
  std::erase_if(rt.host, [&](const HostCall& h) { return h.ts >= last_start; });
  for (const HostCall& h : rt.host) kept_corr.insert(h.corr);
  std::erase_if(rt.device, [&](const DeviceEvent& d) { return d.corr != -1 && !kept_corr.count(d.corr); });
  std::erase_if(rt.steps, [&](const StepMarker& s) { return s.ts >= last_start; });
  return true;
}

void fill_hta_figures(const RankTrace& rt, const NameTable& names, Convention conv, RankReport& out) {
  // Temporal breakdown.
  std::vector<Interval> busy_raw, comp_raw;
  busy_raw.reserve(rt.device.size());
  for (const DeviceEvent& d : rt.device) {
    if (!counts_as_busy(d.kind, conv)) continue;
    busy_raw.push_back({d.ts, d.end});
    if (d.kind == Kind::kCompute) comp_raw.push_back({d.ts, d.end});
  }
  const IntervalSet busy = IntervalSet::from_union(std::move(busy_raw));
  const IntervalSet comp = IntervalSet::from_union(std::move(comp_raw));
  if (!busy.empty()) {
    out.kernel_time_ns = busy.parts().back().end - busy.parts().front().begin;
    out.idle_time_ns = out.kernel_time_ns - busy.measure();
    out.compute_time_ns = comp.measure();
    out.non_compute_time_ns = busy.measure() - out.compute_time_ns;
  }

  // Launch calls and device events by correlation id: the first event with the id (HTA's index_correlation).
  const CorrIndex host_of(rt.host), device_of(rt.device);

  // Per stream: idle breakdown and queue length.
  std::map<int64_t, std::vector<size_t>> by_stream;
  for (size_t i = 0; i < rt.device.size(); ++i) by_stream[rt.device[i].stream].push_back(i);
  struct QueuePoint {
    int64_t ts;
    int delta;
    size_t order;
  };
  std::map<int64_t, std::vector<QueuePoint>> queue;
  for (auto& [stream, idx] : by_stream) queue[stream].reserve(2 * idx.size());
  for (size_t h = 0; h < rt.host.size(); ++h) {
    if (!is_queue_launch(names[rt.host[h].name])) continue;
    const int64_t di = device_of.find(rt.host[h].corr);
    if (di < 0) continue;
    const DeviceEvent& d = rt.device[static_cast<size_t>(di)];
    queue[d.stream].push_back({rt.host[h].ts, +1, h});
    queue[d.stream].push_back({d.ts, -1, rt.host.size() + static_cast<size_t>(di)});
  }
  out.streams.clear();
  for (auto& [stream, idx] : by_stream) {
    StreamStats st;
    st.stream = stream;
    std::vector<size_t> ev;
    for (size_t i : idx)
      if (rt.device[i].kind != Kind::kSync) ev.push_back(i);
    std::stable_sort(ev.begin(), ev.end(), [&](size_t a, size_t b) { return rt.device[a].ts < rt.device[b].ts; });
    for (size_t k = 1; k < ev.size(); ++k) {
      const DeviceEvent& prev = rt.device[ev[k - 1]];
      const DeviceEvent& cur = rt.device[ev[k]];
      const int64_t gap = cur.ts - prev.end;
      const int64_t h = host_of.find(cur.corr);
      if (h >= 0 && rt.host[static_cast<size_t>(h)].ts > prev.end) st.host_wait_ns += gap;
      else if (gap < kKernelWaitNs) st.kernel_wait_ns += gap;
      else st.other_idle_ns += gap;
    }
    auto q = queue.find(stream);
    if (q != queue.end()) {
      std::vector<QueuePoint>& pts = q->second;
      std::sort(pts.begin(), pts.end(), [](const QueuePoint& a, const QueuePoint& b) {
        return a.ts != b.ts ? a.ts < b.ts : a.order < b.order;
      });
      std::vector<int64_t> samples;
      samples.reserve(pts.size());
      int64_t len = 0, sum = 0;
      for (const QueuePoint& p : pts) {
        len += p.delta;
        samples.push_back(len);
        sum += len;
        st.queue_max = std::max(st.queue_max, len);
      }
      st.queue_samples = static_cast<int64_t>(samples.size());
      st.queue_mean = samples.empty() ? 0 : static_cast<double>(sum) / static_cast<double>(samples.size());
      st.queue_p50 = median_of(std::move(samples));
    }
    out.streams.push_back(st);
  }

  // Kernel launch statistics.
  out.launches = 0;
  int64_t delay_sum = 0;
  for (const HostCall& h : rt.host) {
    if (!is_stats_launch(names[h.name])) continue;
    const int64_t di = device_of.find(h.corr);
    if (di < 0) continue;
    const DeviceEvent& d = rt.device[static_cast<size_t>(di)];
    // HTA clips negative delays to 0: a blocking cudaMemcpyAsync ends after its copy started, and without the clip
    // alexnet_single's mean is -161 µs instead of HTA's 400.85 µs (event_sync: -1.4 instead of 1.0).
    const int64_t delay = std::max<int64_t>(0, d.ts - h.end);
    ++out.launches;
    delay_sum += delay;
    if (d.end - d.ts < h.end - h.ts) ++out.launch_short_kernels;
    if (h.end - h.ts > kCpuDurCutoffNs) ++out.cpu_dur_gt_50us;
    if (delay > kLaunchDelayCutoffNs) ++out.launch_delay_gt_100us;
  }
  out.launch_delay_mean_us = out.launches ? static_cast<double>(delay_sum) / 1000.0 / static_cast<double>(out.launches) : 0;
}

}  // namespace coc::analysis::detail
