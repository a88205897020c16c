// PyTorch profiler traces of CPU-only distributed runs (gloo): no device, so the "device" lanes of the overlap
// analysis are the host threads. Two layouts: PyTorch 1.13's bare JSON array (pid "CPU functions", no
// categories, no distributedInfo: the rank comes from the file name) and Kineto's object with cat "cpu_op" /
// "user_annotation" events (HTA's cpu_only sample).
//
// Roles (classify_cpu_op, event_classify.h; docs/analysis.md, "PyTorch CPU traces"):
//  - Computing: the compute operators, on the threads that run any (the compute threads), with nesting resolved:
//    the union of the operators counts (aten::linear holds aten::matmul holds aten::mm: the interval counts once,
//    under the outermost one's name). An operator that calls a collective somewhere below it (a Megatron-style ReduceFromTP whose
//    forward runs dist.all_reduce and waits for it) does not count itself: it spends its own time waiting, so
//    only its collective-free descendants count.
//  - Communication: every collective (gloo:*, c10d::*, ...), on whichever thread runs it: gloo's worker threads
//    run gloo:all_reduce while the main thread waits for it.
//  - Free: the rest of each ProfilerStep.
// Each piece of computing becomes a DeviceEvent named after its outermost operator, on the "stream" of its
// thread id, so that the top list shows the operators the time went to.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "coc/analysis/intervals.h"
#include "event_classify.h"
#include "trace_reader.h"

namespace coc::analysis::detail {

std::vector<RankTrace> build_torch_cpu(CollectedTrace& t, Convention conv) {
  RankTrace r;
  r.format = TraceFormat::kTorchCpu;
  r.rank = t.dist_rank;
  struct Op {
    int64_t ts, end;
    uint32_t name;
    bool comm;
  };
  std::map<uint32_t, std::vector<Op>> ops_by_thread;  // thread index -> its operators and collectives
  auto take = [&](std::deque<RawKept>& q) {
    for (; !q.empty(); q.pop_front()) {
      const RawKept& e = q.front();
      const std::string& name = t.names[e.name];
      const int64_t b = kept_begin(e, conv), en = std::max(b, kept_end(e, conv));
      if (name.rfind("ProfilerStep", 0) == 0) {
        r.steps.push_back({b, en, e.name, false});
        continue;
      }
      const Kind kind = classify_cpu_op(name, t.names[e.cat]);
      if (kind == Kind::kComm)
        r.device.push_back({.ts = b, .end = en, .corr = -1, .stream = t.tid_of(e), .name = e.name, .kind = Kind::kComm});
      if (kind == Kind::kComm || kind == Kind::kCompute) ops_by_thread[e.thread].push_back({b, en, e.name, kind == Kind::kComm});
    }
  };
  take(t.events);
  take(t.cpu_ops);
  size_t compute_threads = 0;
  for (auto& [thread, ops] : ops_by_thread) {
    // The nesting tree: outermost first (by start, the longer of two starting together); a stack of open
    // ancestors. An operator reaching past its parent's end (clock jitter) still counts as its child.
    std::stable_sort(ops.begin(), ops.end(),
                     [](const Op& a, const Op& b) { return a.ts != b.ts ? a.ts < b.ts : a.end > b.end; });
    std::vector<int64_t> parent(ops.size(), -1);
    std::vector<int64_t> open;
    for (size_t i = 0; i < ops.size(); ++i) {
      while (!open.empty() && ops[static_cast<size_t>(open.back())].end <= ops[i].ts) open.pop_back();
      if (!open.empty()) parent[i] = open.back();
      open.push_back(static_cast<int64_t>(i));
    }
    // An operator whose subtree calls a collective spends its own time waiting for it (dist.all_reduce inside a
    // tensor-parallel autograd function): only its collective-free descendants compute.
    std::vector<char> has_comm(ops.size(), 0);
    for (size_t i = ops.size(); i-- > 0;) {
      has_comm[i] |= ops[i].comm;
      if (parent[i] >= 0 && has_comm[i]) has_comm[static_cast<size_t>(parent[i])] = 1;
    }
    // The union of the collective-free operators, swept in start order: an operator inside a counted one adds
    // nothing, one that reaches past it (µs rounding) adds only the part beyond.
    bool computes = false;
    int64_t covered_to = INT64_MIN;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].comm || has_comm[i]) continue;
      computes = true;
      const int64_t b = std::max(ops[i].ts, covered_to);
      if (ops[i].end <= b) continue;
      r.device.push_back({.ts = b, .end = ops[i].end, .corr = -1, .stream = t.threads[thread].second,
                          .name = ops[i].name, .kind = Kind::kCompute});
      covered_to = ops[i].end;
    }
    compute_threads += computes;
  }
  std::stable_sort(r.device.begin(), r.device.end(),
                   [](const DeviceEvent& a, const DeviceEvent& b) { return a.ts < b.ts; });
  r.notes.push_back(fmt::format(
      "PyTorch CPU trace: computing = outermost collective-free operators on the {} compute thread(s), communication = gloo/c10d "
      "collectives on any thread; no launch statistics (no device)",
      compute_threads));
  std::vector<RankTrace> out;
  out.push_back(std::move(r));
  return out;
}

}  // namespace coc::analysis::detail
