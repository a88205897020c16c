// `coc analyze --json`: the whole Report as one JSON document (nlohmann-json). Times are integer ns under keys
// ending in _ns (exact, as computed), HTA's own figures keep HTA's µs under keys ending in _us; percentages are
// of the step window. The split follows docs/semantics.md §7 and Ascend's Overlap Analysis lane names.
#include <nlohmann/json.hpp>

#include "coc/analysis/analyze.h"
#include "report_common.h"

namespace coc::analysis {

namespace {

using nlohmann::json;
using report::pct;

json split_json(const OverlapBreakdown& b) {
  return {{"window_ns", b.window},
          {"computing_ns", b.computing},
          {"communication_ns", b.communication},
          {"overlapped_ns", b.overlapped},
          {"exposed_ns", b.exposed},
          {"free_ns", b.free},
          {"computing_pct", pct(b.computing, b.window)},
          {"exposed_pct", pct(b.exposed, b.window)},
          {"free_pct", pct(b.free, b.window)},
          {"overlap_pct", b.overlap_pct()}};
}

json step_json(const StepReport& s) {
  const Verdict v = verdict_of(s);
  json j = split_json(s.split);
  j["name"] = s.name;
  j["begin_ns"] = s.begin_ns;
  j["end_ns"] = s.end_ns;
  j["verdict"] = {{"exposed", v.exposed}, {"free", v.free}};
  j["host"] = {{"idle_gaps", s.idle_gaps},
               {"idle_gap_ns", s.idle_gap_ns},
               {"launch_queue_mean", s.launch_queue_mean},
               {"launch_queue_max", s.launch_queue_max},
               {"short_kernels", s.short_kernels},
               {"kernels", s.kernels},
               {"host_work_ns", s.host_work_ns}};
  if (s.late_wait_ns >= 0) {  // docs/analysis.md, "Waiting for a later rank"
    j["late_wait_ns"] = s.late_wait_ns;
    j["late_wait_pct"] = pct(s.late_wait_ns, s.split.window);
  }
  return j;
}

json kernels_json(const std::vector<KernelStat>& ks) {
  json a = json::array();
  for (const auto& k : ks) a.push_back({{"name", k.name}, {"kind", k.kind}, {"count", k.count}, {"total_ns", k.total_ns}});
  return a;
}

}  // namespace

std::string render_json(const Report& r) {
  json ranks = json::array();
  for (const auto& rk : r.ranks) {
    json steps = json::array();
    for (const auto& s : rk.steps) {
      steps.push_back(step_json(s));
      steps.back()["auto_timing"] = s.auto_timing;  // per step only: a total may hold both kinds
    }
    json streams = json::array();
    for (const auto& s : rk.streams)
      streams.push_back({{"stream", s.stream},
                         {"host_wait_ns", s.host_wait_ns},
                         {"kernel_wait_ns", s.kernel_wait_ns},
                         {"other_idle_ns", s.other_idle_ns},
                         {"queue_samples", s.queue_samples},
                         {"queue_mean", s.queue_mean},
                         {"queue_p50", s.queue_p50},
                         {"queue_max", s.queue_max}});
    json groups = json::array();
    for (const CommGroupStat& g : rk.comm_groups)
      groups.push_back({{"name", g.name},
                        {"count", g.count},
                        {"communication_ns", g.communication_ns},
                        {"exposed_ns", g.exposed_ns}});
    json ops = json::array();
    for (const CommOpStat& o : rk.comm_ops) {
      ops.push_back({{"op", o.op},
                     {"collective", o.collective},
                     {"communicator", o.communicator},
                     {"count", o.count},
                     {"communication_ns", o.communication_ns},
                     {"exposed_ns", o.exposed_ns}});
      if (o.late_wait_ns >= 0) ops.back()["late_wait_ns"] = o.late_wait_ns;
    }
    json j = {{"rank", rk.rank},
              {"file", rk.file},
              {"format", to_string(rk.format)},
              {"has_device_activity", rk.has_device_activity},
              {"steps", steps},
              {"total", step_json(rk.total)},
              {"hta",
               {{"kernel_time_ns", rk.kernel_time_ns},
                {"idle_time_ns", rk.idle_time_ns},
                {"compute_time_ns", rk.compute_time_ns},
                {"non_compute_time_ns", rk.non_compute_time_ns},
                {"launches", rk.launches},
                {"launch_delay_mean_us", rk.launch_delay_mean_us},
                {"launch_delay_gt_100us", rk.launch_delay_gt_100us},
                {"cpu_dur_gt_50us", rk.cpu_dur_gt_50us},
                {"streams", streams}}},
              {"top_kernels", kernels_json(rk.top_kernels)},
              {"comm_groups", groups},
              {"comm_ops", ops},
              {"data_quality",
               {{"events", rk.events},
                {"device_events", rk.device_events},
                {"malformed_events", rk.malformed_events},
                {"zero_ts_events", rk.zero_ts_events}}},
              {"notes", rk.notes}};
    if (rk.waited_for_rank >= 0) j["waited_for"] = {{"rank", rk.waited_for_rank}, {"exposed_ns", rk.waited_for_ns}};
    if (rk.vendor_overlap_lanes) j["vendor_overlap_lanes"] = split_json(*rk.vendor_overlap_lanes);
    if (rk.pipeline) {
      const PipelineReport& p = *rk.pipeline;
      json per_step = json::array();
      for (const StepReport& s : rk.steps)
        per_step.push_back({{"name", s.name}, {"bubble_ns", s.pp_bubble_ns},
                            {"bubble_pct", pct(s.pp_bubble_ns, s.split.window)}});
      const std::optional<double> ideal = p.ideal_bubble_pct();
      j["pipeline"] = {{"stages", p.stages > 0 ? json(p.stages) : json()},
                       {"micro_batches", p.micro_batches > 0 ? json(p.micro_batches) : json()},
                       {"virtual_stages", p.virtual_stages},
                       {"ideal_bubble_pct", ideal ? json(*ideal) : json()},
                       {"waits", p.waits},
                       {"bubble_ns", rk.total.pp_bubble_ns},
                       {"bubble_pct", pct(rk.total.pp_bubble_ns, rk.total.split.window)},
                       {"steps", per_step}};
    }
    if (rk.format == TraceFormat::kCoc) {
      json hw = json::array(), gaps = json::array();
      for (const HostWorkStat& h : rk.host_work)
        hw.push_back({{"name", h.name}, {"count", h.count}, {"free_ns", h.free_ns}});
      for (const FreeGap& g : rk.free_gaps)
        gaps.push_back({{"begin_ns", g.begin_ns}, {"end_ns", g.end_ns}, {"after", g.after}, {"before", g.before},
                        {"host_work", g.host_work}});
      j["free"] = {{"host_work", hw}, {"longest_gaps", gaps}};
    }
    ranks.push_back(std::move(j));
  }
  json out = {{"tool", "coc analyze"},
              {"convention", to_string(r.convention)},
              {"ranks", ranks},
              {"balance",
               {{"slow_rank", r.slow_rank},
                {"slowest_rank", r.slowest_rank},
                {"fastest_rank", r.fastest_rank},
                {"least_compute_rank", r.least_compute_rank},
                {"least_compute_ns", r.least_compute_ns},
                {"most_compute_rank", r.most_compute_rank},
                {"most_compute_ns", r.most_compute_ns},
                {"unequal_compute", r.unequal_compute}}},
              {"top_kernels", kernels_json(r.top_kernels)}};
  // Replace, not throw, on invalid UTF-8: kernel names from real traces may carry broken bytes (edge case 24 of
  // docs/edge-cases.md).
  return out.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace coc::analysis
