// The overlap split per step (docs/semantics.md §7, msprof's "Overlap Analysis" lanes), the host-bound evidence, the
// top kernels and the timeline lanes of one rank.
//
// Windows: the ProfilerStep / coc iteration windows, each clipped (events crossing a boundary count inside it
// only), and a total window over all kept steps, or over the device span when the trace has no steps.
// Under kHta the total window is HTA's kernel_time span (first device start to last device end), so that
// total.split is HTA's "derived split". Under kAscend each step's window is trimmed to its device tasks: from the
// first device task starting in the step to the last one's end (clipped to the step), because msprof's "Overlap
// Analysis" lanes span exactly that, not the ProfilerStep (whose host-only lead-in and tail would otherwise count
// as Free); the total is then the sum over the steps.
// Host-bound evidence (per window): idle gaps where the next device event's launch call started after the
// device had gone idle (the host was late, not the device busy); the launch-queue depth seen by each kernel as
// it starts (launch calls issued minus device events started; HTA's queue_length, summed over streams);
// kernels shorter than their launch call (the host cannot keep up with them).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "corr_index.h"
#include "event_classify.h"
#include "metrics.h"

namespace coc::analysis::detail {

namespace {

struct HostBound {
  explicit HostBound(const RankTrace& rt) : host_of(rt.host) {}
  const HostCall* host(const RankTrace& rt, const DeviceEvent& d) const {
    const int64_t i = host_of.find(d.corr);
    return i < 0 ? nullptr : &rt.host[static_cast<size_t>(i)];
  }
  std::vector<const DeviceEvent*> kernels;      // non-sync device events, by start
  CorrIndex host_of;
  std::vector<int64_t> launch_ts, matched_starts;  // sorted
  struct Part {
    Interval iv;
    const DeviceEvent* first;
  };
  std::vector<Part> busy_parts;  // union of busy events with the event that opened each part
};

HostBound prepare(const RankTrace& rt, Convention conv) {
  HostBound hb(rt);
  std::vector<const DeviceEvent*> busy;
  hb.kernels.reserve(rt.device.size());
  busy.reserve(rt.device.size());
  for (const DeviceEvent& d : rt.device) {
    if (d.kind != Kind::kSync) hb.kernels.push_back(&d);
    if (counts_as_busy(d.kind, conv) && d.end > d.ts) busy.push_back(&d);
    if (const HostCall* h = hb.host(rt, d)) {
      hb.launch_ts.push_back(h->ts);
      hb.matched_starts.push_back(d.ts);
    }
  }
  auto by_start = [](const DeviceEvent* a, const DeviceEvent* b) { return a->ts < b->ts; };
  std::stable_sort(hb.kernels.begin(), hb.kernels.end(), by_start);
  std::stable_sort(busy.begin(), busy.end(), by_start);
  std::sort(hb.launch_ts.begin(), hb.launch_ts.end());
  std::sort(hb.matched_starts.begin(), hb.matched_starts.end());
  for (const DeviceEvent* d : busy) {
    if (!hb.busy_parts.empty() && d->ts <= hb.busy_parts.back().iv.end)
      hb.busy_parts.back().iv.end = std::max(hb.busy_parts.back().iv.end, d->end);
    else
      hb.busy_parts.push_back({{d->ts, d->end}, d});
  }
  return hb;
}

void host_bound_evidence(const RankTrace& rt, const HostBound& hb, Interval w, StepReport& s) {
  // Kernels starting in the window.
  auto lo = std::lower_bound(hb.kernels.begin(), hb.kernels.end(), w.begin,
                             [](const DeviceEvent* d, int64_t t) { return d->ts < t; });
  double depth_sum = 0;
  for (auto it = lo; it != hb.kernels.end() && (*it)->ts < w.end; ++it) {
    const DeviceEvent& d = **it;
    ++s.kernels;
    const HostCall* h = hb.host(rt, d);
    if (h && d.end - d.ts < h->end - h->ts) ++s.short_kernels;
    const int64_t issued = std::upper_bound(hb.launch_ts.begin(), hb.launch_ts.end(), d.ts) - hb.launch_ts.begin();
    const int64_t started =
        std::lower_bound(hb.matched_starts.begin(), hb.matched_starts.end(), d.ts) - hb.matched_starts.begin();
    const int64_t depth = std::max<int64_t>(0, issued - started);
    depth_sum += static_cast<double>(depth);
    s.launch_queue_max = std::max(s.launch_queue_max, depth);
  }
  s.launch_queue_mean = s.kernels ? depth_sum / static_cast<double>(s.kernels) : 0;
  // Idle gaps between busy parts inside the window.
  for (size_t i = 1; i < hb.busy_parts.size(); ++i) {
    const Interval gap{hb.busy_parts[i - 1].iv.end, hb.busy_parts[i].iv.begin};
    const int64_t b = std::max(gap.begin, w.begin), e = std::min(gap.end, w.end);
    if (b >= e) continue;
    const DeviceEvent* next = hb.busy_parts[i].first;
    const HostCall* h = hb.host(rt, *next);
    if (h && h->ts > gap.begin) {
      ++s.idle_gaps;
      s.idle_gap_ns += e - b;
    }
  }
}

void add_lanes(const IntervalSet& c, const IntervalSet& m, Interval w, std::vector<LaneSegment>& lanes) {
  const IntervalSet cw = c.clip(w), mw = m.clip(w);
  IntervalSet win = IntervalSet::from_union({w});
  const IntervalSet sets[4] = {cw, mw, mw.subtract(cw), win.subtract(cw.unite(mw))};
  for (uint8_t lane = 0; lane < 4; ++lane)
    for (const Interval& iv : sets[lane].parts()) lanes.push_back({lane, iv.begin, iv.end});
}

// Merges neighbouring segments of one lane across the smallest gaps until at most `cap` remain.
void cap_lanes(std::vector<LaneSegment>& lanes, size_t cap) {
  if (cap == 0 || lanes.size() <= cap) return;
  std::stable_sort(lanes.begin(), lanes.end(), [](const LaneSegment& a, const LaneSegment& b) {
    return a.lane != b.lane ? a.lane < b.lane : a.begin_ns < b.begin_ns;
  });
  for (int64_t gap = 1000; lanes.size() > cap; gap *= 2) {
    std::vector<LaneSegment> merged;
    for (const LaneSegment& s : lanes) {
      if (!merged.empty() && merged.back().lane == s.lane && s.begin_ns - merged.back().end_ns <= gap)
        merged.back().end_ns = std::max(merged.back().end_ns, s.end_ns);
      else
        merged.push_back(s);
    }
    lanes.swap(merged);
  }
}

std::optional<OverlapBreakdown> vendor_lanes(const RankTrace& rt) {
  if (!rt.has_vendor_lanes) return std::nullopt;
  int64_t m[4];
  for (int i = 0; i < 4; ++i) m[i] = IntervalSet::from_union(rt.vendor_lanes[i]).measure();
  OverlapBreakdown v;
  v.computing = m[0];
  v.communication = m[1];
  v.exposed = m[2];
  v.overlapped = m[1] - m[2];
  v.free = m[3];
  v.window = m[0] + m[2] + m[3];
  return v;
}

// coc traces: what Free holds. The traced host work inside it, per name, and its longest intervals named by the
// events around them. Free itself is not changed (it stays msprof's W \ (C ∪ M)): the host work only explains it.
void explain_free(const RankTrace& rt, const NameTable& names, const IntervalSet& busy, RankReport& out) {
  const Interval w{out.total.begin_ns, out.total.end_ns};
  IntervalSet free_set = IntervalSet::from_union({w}).subtract(busy);
  if (!out.steps.empty()) {  // only inside the steps (they tile the span in coc traces, but need not elsewhere)
    std::vector<Interval> ws;
    for (const StepReport& s : out.steps) ws.push_back({s.begin_ns, s.end_ns});
    free_set = free_set.intersect(IntervalSet::from_union(std::move(ws)));
  }
  std::map<uint32_t, std::vector<Interval>> by_name;
  std::map<uint32_t, int64_t> counts;
  for (const RankTrace::HostWork& h : rt.host_work) {
    by_name[h.name].push_back({h.ts, h.end});
    ++counts[h.name];
  }
  out.host_work.clear();
  for (auto& [name, ivs] : by_name)
    out.host_work.push_back({names[name], counts[name], IntervalSet::from_union(std::move(ivs)).intersect(free_set).measure()});
  std::stable_sort(out.host_work.begin(), out.host_work.end(),
                   [](const HostWorkStat& a, const HostWorkStat& b) { return a.free_ns > b.free_ns; });

  std::vector<Interval> gaps = free_set.parts();
  const size_t keep = std::min<size_t>(3, gaps.size());
  std::partial_sort(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(keep), gaps.end(),
                    [](const Interval& a, const Interval& b) {
                      return a.length() != b.length() ? a.length() > b.length() : a.begin < b.begin;
                    });
  gaps.resize(keep);
  out.free_gaps.clear();
  for (const Interval& g : gaps) {
    FreeGap f;
    f.begin_ns = g.begin;
    f.end_ns = g.end;
    int64_t best_after = INT64_MIN, best_before = INT64_MAX;
    for (const DeviceEvent& d : rt.device) {
      if ((d.kind != Kind::kCompute && d.kind != Kind::kComm) || d.end <= d.ts) continue;
      if (d.end <= g.begin && d.end > best_after) best_after = d.end, f.after = names[d.name];
      if (d.ts >= g.end && d.ts < best_before) best_before = d.ts, f.before = names[d.name];
    }
    if (best_after != g.begin) f.after.clear();   // the gap opened at a step boundary, not after an event
    if (best_before != g.end) f.before.clear();
    int64_t most = 0;
    for (const RankTrace::HostWork& h : rt.host_work) {
      const int64_t o = std::min(h.end, g.end) - std::max(h.ts, g.begin);
      if (o > most) most = o, f.host_work = names[h.name];
    }
    out.free_gaps.push_back(std::move(f));
  }
}

// Per communicator row (comm_group_row: coc's pipeline links and waits make one "pp" row): its collectives' union
// inside the analysed windows, and the part of it outside compute.
void comm_groups(const RankTrace& rt, const NameTable& names, const IntervalSet& compute, const IntervalSet& windows,
                 RankReport& out) {
  std::map<std::string_view, std::vector<Interval>> by_group;  // views of `names` or static strings
  std::map<std::string_view, int64_t> counts;
  for (const DeviceEvent& d : rt.device) {
    if (d.kind != Kind::kComm || d.end <= d.ts) continue;
    if (d.end <= out.total.begin_ns || d.ts >= out.total.end_ns) continue;  // outside the analysed span
    const std::string_view row = comm_group_row(d.group == 0 ? std::string_view() : names[d.group], names[d.name]);
    if (row.empty()) continue;
    by_group[row].push_back({d.ts, d.end});
    ++counts[row];
  }
  out.comm_groups.clear();
  for (auto& [group, ivs] : by_group) {
    const IntervalSet m = IntervalSet::from_union(std::move(ivs)).intersect(windows);
    out.comm_groups.push_back({std::string(group), counts[group], m.measure(), m.subtract(compute).measure()});
  }
  std::stable_sort(out.comm_groups.begin(), out.comm_groups.end(), [](const CommGroupStat& a, const CommGroupStat& b) {
    return a.exposed_ns != b.exposed_ns ? a.exposed_ns > b.exposed_ns : a.name < b.name;
  });
}

// An operation's row of comm_ops: (op, collective, communicator row).
using OpKey = std::tuple<std::string_view, std::string_view, std::string_view>;  // views of `names` or static

OpKey op_key(const DeviceEvent& d, const NameTable& names) {
  const std::string_view group = d.group == 0 ? std::string_view() : names[d.group];
  return {d.op == 0 ? std::string_view() : names[d.op], comm_collective(names[d.name]),
          comm_group_row(group, names[d.name])};
}

// Per operation (coc's tagged collectives; docs/analysis.md, "Exposed communication per operation"): as comm_groups,
// keyed by (op, collective, communicator row). Untagged collectives of a trace that tags others (pp_recv_wait, say)
// keep a row of their own under their collective, so the rows cover all the communication; a trace with no tag at
// all has no rows.
void comm_ops(const RankTrace& rt, const NameTable& names, const IntervalSet& compute, const IntervalSet& windows,
              RankReport& out) {
  using Key = OpKey;
  struct Acc {
    std::vector<Interval> ivs;
    int64_t count = 0;
  };
  std::map<Key, Acc> by_op;
  bool tagged = false;
  for (const DeviceEvent& d : rt.device) {
    if (d.kind != Kind::kComm || d.end <= d.ts) continue;
    if (d.end <= out.total.begin_ns || d.ts >= out.total.end_ns) continue;  // outside the analysed span
    tagged = tagged || d.op != 0;
    Acc& a = by_op[op_key(d, names)];
    a.ivs.push_back({d.ts, d.end});
    ++a.count;
  }
  out.comm_ops.clear();
  if (!tagged) return;
  for (auto& [key, a] : by_op) {
    const IntervalSet m = IntervalSet::from_union(std::move(a.ivs)).intersect(windows);
    out.comm_ops.push_back({std::string(std::get<0>(key)), std::string(std::get<1>(key)), std::string(std::get<2>(key)),
                            a.count, m.measure(), m.subtract(compute).measure()});
  }
  std::stable_sort(out.comm_ops.begin(), out.comm_ops.end(), [](const CommOpStat& a, const CommOpStat& b) {
    if (a.exposed_ns != b.exposed_ns) return a.exposed_ns > b.exposed_ns;
    return a.communication_ns > b.communication_ns;  // stable: ties keep the map's (op, collective, row) order
  });
}

// What fill_late_waits needs of this rank: its collectives that carry a key, inside the analysed span (the pipeline's
// links and waits left out: a stage's receive is matched by a neighbour's send, not by the same op, and its waits
// are the bubble), and its exposed communication there: over the total's window and the steps' (under kHta the
// total spans the whole trace, the steps leave out the last).
void keep_wait_inputs(const RankTrace& rt, const NameTable& names, const IntervalSet& exposed, RankReport& out) {
  std::map<OpKey, int32_t> rows;  // views of out.comm_ops' strings
  for (size_t i = 0; i < out.comm_ops.size(); ++i) {
    const CommOpStat& o = out.comm_ops[i];
    rows[{o.op, o.collective, o.communicator}] = static_cast<int32_t>(i);
  }
  out.posts.clear();
  for (const DeviceEvent& d : rt.device) {
    if (d.kind != Kind::kComm || d.collective < 0 || d.end <= d.ts) continue;
    if (d.end <= out.total.begin_ns || d.ts >= out.total.end_ns) continue;
    const OpKey key = op_key(d, names);
    if (std::get<2>(key) == "pp") continue;
    const auto it = rows.find(key);
    out.posts.push_back({d.group, it == rows.end() ? -1 : it->second, d.collective, d.ts, d.end});
  }
  out.exposed_parts = out.posts.empty() ? std::vector<Interval>{} : exposed.parts();
}

/// coc traces: marks the steps holding a trace::kAutoTimingEvent and notes the others' totals with their verdicts.
void steady_state_note(const RankTrace& rt, RankReport& out) {
  if (rt.auto_timing.empty()) return;
  StepReport rest;
  OverlapBreakdown& sum = rest.split;
  std::string timed;
  int steady = 0;
  for (StepReport& s : out.steps) {
    s.auto_timing = std::any_of(rt.auto_timing.begin(), rt.auto_timing.end(),
                                [&](const Interval& t) { return s.begin_ns <= t.begin && t.begin < s.end_ns; });
    if (s.auto_timing) {
      timed += (timed.empty() ? "" : ", ") + s.name;
      continue;
    }
    ++steady;
    sum += s.split;
  }
  if (timed.empty()) return;
  auto pct = [&](int64_t v) { return sum.window > 0 ? 100.0 * static_cast<double>(v) / sum.window : 0.0; };
  if (steady == 0) {
    out.notes.push_back(fmt::format("--coc-parallel-num auto timed its candidates in {}, every step here: profile "
                                    "later steps for the steady state",
                                    timed));
  } else if (sum.window > 0) {
    const Verdict v = verdict_of(rest);
    out.notes.push_back(fmt::format("--coc-parallel-num auto timed its candidates in {} (once per shape); the other "
                                    "{} step{}: computing {:.1f}%, exposed {:.1f}% ({}), free {:.1f}% ({})",
                                    timed, steady, steady == 1 ? "" : "s", pct(sum.computing), pct(sum.exposed),
                                    v.exposed, pct(sum.free), v.free));
  }
}

}  // namespace

void fill_overlap(const RankTrace& rt, const NameTable& names, const AnalyzeOptions& opt, RankReport& out) {
  const Convention conv = opt.convention;
  std::vector<Interval> c_raw, m_raw;
  c_raw.reserve(rt.device.size());
  int64_t span_b = INT64_MAX, span_e = INT64_MIN;
  for (const DeviceEvent& d : rt.device) {
    if (d.kind == Kind::kCompute) c_raw.push_back({d.ts, d.end});
    if (d.kind == Kind::kComm) m_raw.push_back({d.ts, d.end});
    if (counts_as_busy(d.kind, conv) && d.end > d.ts) span_b = std::min(span_b, d.ts), span_e = std::max(span_e, d.end);
  }
  const IntervalSet c = IntervalSet::from_union(std::move(c_raw)), m = IntervalSet::from_union(std::move(m_raw));
  const IntervalSet busy = c.unite(m);
  // coc traces: the pipeline bubble, the stage's waits for a receive less any compute (docs/analysis.md).
  std::vector<Interval> r_raw;
  if (rt.format == TraceFormat::kCoc)
    for (const DeviceEvent& d : rt.device)
      if (d.kind == Kind::kComm && d.end > d.ts && is_pp_recv_wait(names[d.name])) r_raw.push_back({d.ts, d.end});
  const bool pipelined = !r_raw.empty() || rt.pp_stages > 1;
  const IntervalSet bubble = IntervalSet::from_union(std::vector<Interval>(r_raw)).subtract(c);
  std::vector<Interval> h_raw;
  for (const RankTrace::HostWork& h : rt.host_work) h_raw.push_back({h.ts, h.end});
  const IntervalSet host_work = IntervalSet::from_union(std::move(h_raw)).subtract(busy);  // only its free part
  out.has_device_activity = !rt.device.empty();
  out.device_events = static_cast<int64_t>(rt.device.size());
  out.vendor_overlap_lanes = vendor_lanes(rt);
  if (!out.has_device_activity)
    out.notes.push_back("no device activity: the trace holds host events only (a CPU-only run?)");

  std::vector<StepMarker> steps;
  for (const StepMarker& s : rt.steps)
    if (!s.on_device && out.has_device_activity) steps.push_back(s);  // no device: no split to report
  std::stable_sort(steps.begin(), steps.end(), [](const StepMarker& a, const StepMarker& b) { return a.ts < b.ts; });
  steps.erase(std::unique(steps.begin(), steps.end(),
                          [](const StepMarker& a, const StepMarker& b) { return a.ts == b.ts && a.end == b.end; }),
              steps.end());

  const HostBound hb = prepare(rt, conv);
  // kAscend: every device task (any kind: msprof's lane starts at the first task and ends with the last), by start.
  std::vector<Interval> tasks;
  if (conv == Convention::kAscend) {
    for (const DeviceEvent& d : rt.device) tasks.push_back({d.ts, d.end});
    std::sort(tasks.begin(), tasks.end(), [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  }
  auto device_span = [&](int64_t b, int64_t e) -> Interval {
    auto lo = std::lower_bound(tasks.begin(), tasks.end(), b, [](const Interval& x, int64_t t) { return x.begin < t; });
    int64_t first = INT64_MAX, last = INT64_MIN;
    for (auto it = lo; it != tasks.end() && it->begin < e; ++it) first = std::min(first, it->begin), last = std::max(last, it->end);
    if (first > last) return {b, b};  // no device task in the step: an empty window
    return {first, std::min(last, e)};
  };
  auto window = [&](int64_t b, int64_t e, std::string name) {
    StepReport s;
    s.name = std::move(name);
    s.begin_ns = b;
    s.end_ns = std::max(b, e);
    s.split = overlap_breakdown(c, m, {s.begin_ns, s.end_ns});
    s.host_work_ns = host_work.clip({s.begin_ns, s.end_ns}).measure();
    s.pp_bubble_ns = bubble.clip({s.begin_ns, s.end_ns}).measure();
    host_bound_evidence(rt, hb, {s.begin_ns, s.end_ns}, s);
    return s;
  };
  out.steps.clear();
  out.lanes.clear();
  bool lanes_capped = false;
  for (const StepMarker& st : steps) {
    const Interval w = conv == Convention::kAscend ? device_span(st.ts, st.end) : Interval{st.ts, st.end};
    out.steps.push_back(window(w.begin, w.end, names[st.name]));
    add_lanes(c, m, {out.steps.back().begin_ns, out.steps.back().end_ns}, out.lanes);
    if (out.lanes.size() > 2 * opt.max_lane_segments) {  // bound memory on traces with many steps
      cap_lanes(out.lanes, opt.max_lane_segments);
      lanes_capped = true;
    }
  }
  steady_state_note(rt, out);
  const bool have_span = span_b < span_e;
  if (conv == Convention::kAscend && !steps.empty()) {
    // The trimmed windows leave gaps between steps that belong to no lane: the total is the steps' sum.
    out.total = window(out.steps.front().begin_ns, out.steps.back().end_ns, "all steps");
    OverlapBreakdown sum;
    int64_t host_work_ns = 0, bubble_ns = 0;
    for (const StepReport& s : out.steps) {
      sum += s.split;
      host_work_ns += s.host_work_ns;
      bubble_ns += s.pp_bubble_ns;
    }
    out.total.split = sum;
    out.total.host_work_ns = host_work_ns;
    out.total.pp_bubble_ns = bubble_ns;
  } else if (conv != Convention::kHta && !steps.empty()) {
    int64_t e = steps.front().end;
    for (const StepMarker& st : steps) e = std::max(e, st.end);
    out.total = window(steps.front().ts, e, "all steps");
  } else if (have_span) {
    out.total = window(span_b, span_e, "whole trace");
  } else {
    out.total = StepReport{};
    out.total.name = "whole trace";
  }
  if (steps.empty() && have_span) add_lanes(c, m, {out.total.begin_ns, out.total.end_ns}, out.lanes);
  {
    std::vector<Interval> ws;
    for (const StepReport& s : out.steps) ws.push_back({s.begin_ns, s.end_ns});
    if (ws.empty()) ws.push_back({out.total.begin_ns, out.total.end_ns});
    const IntervalSet windows = IntervalSet::from_union(std::move(ws));
    comm_groups(rt, names, c, windows, out);
    comm_ops(rt, names, c, windows, out);
    if (rt.format == TraceFormat::kCoc)
      keep_wait_inputs(rt, names, m.subtract(c).clip({out.total.begin_ns, out.total.end_ns}).unite(
                                      m.subtract(c).intersect(windows)), out);
  }
  if (rt.format == TraceFormat::kCoc && out.has_device_activity) explain_free(rt, names, busy, out);
  if (pipelined && out.has_device_activity) {
    PipelineReport p;
    p.stages = rt.pp_stages;
    p.micro_batches = rt.pp_micro_batches;
    p.virtual_stages = std::max<int64_t>(rt.pp_virtual_stages, 1);
    for (const Interval& iv : r_raw)
      if (iv.end > out.total.begin_ns && iv.begin < out.total.end_ns) ++p.waits;
    out.pipeline = p;
  }
  if (out.lanes.size() > opt.max_lane_segments || lanes_capped) {
    cap_lanes(out.lanes, opt.max_lane_segments);
    out.notes.push_back("timeline lanes merged across small gaps to stay under max_lane_segments");
  }

  // Top kernels by total device time.
  std::unordered_map<uint32_t, KernelStat> by_name;
  for (const DeviceEvent& d : rt.device) {
    KernelStat& k = by_name[d.name];
    if (k.count == 0) {
      k.name = names[d.name];
      k.kind = kind_name(d.kind);
    }
    ++k.count;
    k.total_ns += d.end - d.ts;
  }
  out.top_kernels.clear();
  for (auto& [id, k] : by_name) out.top_kernels.push_back(std::move(k));
  std::sort(out.top_kernels.begin(), out.top_kernels.end(), [](const KernelStat& a, const KernelStat& b) {
    return a.total_ns != b.total_ns ? a.total_ns > b.total_ns : a.name < b.name;
  });
  if (opt.top_kernels >= 0 && out.top_kernels.size() > static_cast<size_t>(opt.top_kernels))
    out.top_kernels.resize(static_cast<size_t>(opt.top_kernels));
}

}  // namespace coc::analysis::detail
