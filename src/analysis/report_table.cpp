// The terminal table of `coc analyze`: per rank and per step the overlap split (docs/semantics.md §7) in µs and % of
// the step, HTA's overlap %, MindSpeed-LLM's verdicts, host-bound evidence when the device idles, data-quality
// notes, the waits for a later rank, the rank balance of step and compute times (msprof-analyze's slow-rank rule:
// max > min × 1.05) and the top kernels.
#include <fmt/format.h>

#include <algorithm>

#include "coc/analysis/analyze.h"
#include "coc/core/printable.h"
#include "report_common.h"

namespace coc::analysis {

namespace {

using report::pct;
using report::us;

struct Style {
  bool color;
  std::string paint(const std::string& s, const char* code) const {
    return color ? fmt::format("\033[{}m{}\033[0m", code, s) : s;
  }
  // Green for ok, yellow for watch / host-bound?, red for needs work: the verdict words stay, so colour is a hint.
  std::string verdict(const std::string& v) const {
    if (v == "ok") return paint(fmt::format("{:<10}", v), "32");
    if (v == "needs work") return paint(fmt::format("{:<10}", v), "31");
    return paint(fmt::format("{:<10}", v), "33");
  }
};

void step_row(std::string& out, const Style& st, const std::string& name, const StepReport& s) {
  const OverlapBreakdown& b = s.split;
  const Verdict v = verdict_of(s);
  std::string label = name.size() > 22 ? name.substr(0, 21) + "~" : name;
  out += fmt::format("  {:<22} {:>12.1f} {:>12.1f} {:>5.1f}% {:>12.1f} {:>12.1f} {:>12.1f} {:>5.1f}% {:>12.1f} {:>5.1f}% "
                     "{:>7.1f}%  {} {}\n",
                     label, us(b.window), us(b.computing), pct(b.computing, b.window), us(b.communication),
                     us(b.overlapped), us(b.exposed), pct(b.exposed, b.window), us(b.free), pct(b.free, b.window),
                     b.overlap_pct(), st.verdict(v.exposed), st.verdict(v.free));
}

// Host-bound evidence, reported whenever the device idles inside the analysed span: idle gaps that end with a
// late launch say the host was not keeping up; a near-empty launch queue and kernels shorter than their launch
// call say the same (HTA's idle-time and queue-length analyses).
void host_evidence(std::string& out, const RankReport& rk) {
  const StepReport& t = rk.total;
  if (t.split.free <= 0) return;
  // A coc trace has no launches: its Free is explained by the host work traced inside it and its longest gaps.
  if (rk.format == TraceFormat::kCoc) {
    out += "  " + report::free_explanation(rk) + "\n";
    return;
  }
  out += fmt::format("  host-bound evidence: device idle {:.1f} µs ({:.1f}% of the span); {} idle gap(s) ended by a "
                     "late launch ({:.1f} µs); launch queue mean {:.2f}, max {}; {}/{} kernels shorter than their "
                     "launch call\n",
                     us(t.split.free), pct(t.split.free, t.split.window), t.idle_gaps, us(t.idle_gap_ns),
                     t.launch_queue_mean, t.launch_queue_max, t.short_kernels, t.kernels);
}

// How much of the exposed communication was a wait for a later rank (docs/analysis.md): time the link could not have
// saved.
void late_waits(std::string& out, const RankReport& rk) {
  const std::string line = report::late_wait_line(rk);
  if (!line.empty()) out += "  " + line + "\n";
}

// Which communicators the exposed communication came from (coc and Kineto traces name them).
void comm_groups(std::string& out, const RankReport& rk) {
  if (rk.comm_groups.empty()) return;
  out += "  communication by communicator (exposed = not overlapped by compute; groups may be exposed at once):\n";
  for (const CommGroupStat& g : rk.comm_groups) {
    const std::string name = printable(g.name, false);  // a trace's bytes must not drive the terminal
    out += fmt::format("    {:<28} {:>12.1f} µs in {:>6} collective(s), exposed {:>12.1f} µs ({:.0f}%), hidden {:.0f}%\n",
                       name.size() > 28 ? name.substr(0, 27) + "~" : name, us(g.communication_ns), g.count,
                       us(g.exposed_ns), pct(g.exposed_ns, g.communication_ns),
                       pct(g.communication_ns - g.exposed_ns, g.communication_ns));
  }
}

// Which operations the exposed communication came from (coc traces tag their collectives): the top rows by exposed
// time, the rest summed in one line; --json and --html carry every row.
constexpr size_t kTopOps = 8;

std::string clip(const std::string& s, size_t width) {
  const std::string p = printable(s, false);  // a trace's bytes must not drive the terminal
  return p.size() > width ? p.substr(0, width - 1) + "~" : p;
}

void comm_ops(std::string& out, const RankReport& rk) {
  if (rk.comm_ops.empty()) return;
  out += fmt::format("  exposed communication by operation (layers.<i>. folded into layers.*.; exposed = not "
                     "overlapped by compute; ops may be exposed at once), top {} of {}:\n",
                     std::min(kTopOps, rk.comm_ops.size()), rk.comm_ops.size());
  // With the waits for a later rank known, a last column says how much of each op's exposed time they were.
  const bool waits = rk.total.late_wait_ns >= 0;
  out += fmt::format("    {:<40} {:<16} {:<10} {:>12} {:>7} {:>12} {:>8}{}\n", "operation", "collective", "comm",
                     "comm µs", "events", "exposed µs", "exposed%", waits ? fmt::format(" {:>12}", "waiting µs") : "");
  for (size_t i = 0; i < rk.comm_ops.size() && i < kTopOps; ++i) {
    const CommOpStat& o = rk.comm_ops[i];
    out += fmt::format("    {:<40} {:<16} {:<10} {:>12.1f} {:>7} {:>12.1f} {:>7.0f}%{}\n",
                       clip(o.op.empty() ? "(untagged)" : o.op, 40), clip(o.collective, 16),
                       clip(o.communicator.empty() ? "-" : o.communicator, 10), us(o.communication_ns), o.count,
                       us(o.exposed_ns), pct(o.exposed_ns, o.communication_ns),
                       waits && o.late_wait_ns >= 0 ? fmt::format(" {:>12.1f}", us(o.late_wait_ns)) : "");
  }
  if (rk.comm_ops.size() <= kTopOps) return;
  CommOpStat rest;
  rest.late_wait_ns = 0;
  for (size_t i = kTopOps; i < rk.comm_ops.size(); ++i) {
    rest.late_wait_ns += std::max<int64_t>(rk.comm_ops[i].late_wait_ns, 0);
    rest.count += rk.comm_ops[i].count;
    rest.communication_ns += rk.comm_ops[i].communication_ns;
    rest.exposed_ns += rk.comm_ops[i].exposed_ns;
  }
  out += fmt::format("    {:<68} {:>12.1f} {:>7} {:>12.1f}{} (sums)\n",
                     fmt::format("{} more operation(s)", rk.comm_ops.size() - kTopOps), us(rest.communication_ns),
                     rest.count, us(rest.exposed_ns), waits ? fmt::format(" {:>21.1f}", us(rest.late_wait_ns)) : "");
}

// The pipeline bubble per step, with the ideal 1F1B bubble (docs/analysis.md, "Pipeline bubble").
void pipeline(std::string& out, const RankReport& rk) {
  if (!rk.pipeline) return;
  out += "  " + report::pipeline_heading(*rk.pipeline) + ":\n";
  auto row = [&](const std::string& name, const StepReport& s) {
    const std::string label = name.size() > 22 ? name.substr(0, 21) + "~" : name;
    out += fmt::format("    {:<22} {:>12.1f} µs {:>5.1f}% of the step\n", label, us(s.pp_bubble_ns),
                       pct(s.pp_bubble_ns, s.split.window));
  };
  for (const StepReport& s : rk.steps) row(s.name, s);
  row(rk.steps.empty() ? rk.total.name : "total", rk.total);
}

void kernels(std::string& out, const std::vector<KernelStat>& ks, const std::string& indent) {
  for (const auto& k : ks) {
    std::string name = k.name.size() > 70 ? k.name.substr(0, 69) + "~" : k.name;
    out += fmt::format("{}{:>12.1f} µs {:>8} x  {:<13} {}\n", indent, us(k.total_ns), k.count, k.kind, name);
  }
}

}  // namespace

std::string render_table(const Report& r, bool color) {
  const Style st{color};
  std::string out;
  out += fmt::format("coc analyze: {} rank(s), convention {}\n", r.ranks.size(), report::convention_summary(r.convention));
  out += "times in µs; % of the step; overlap% = overlapped / communication (HTA); verdicts: exposed ≤ 10% ok, "
         "> 20% needs work; free < 3% ok, else host-bound?\n";
  const std::string header =
      fmt::format("  {:<22} {:>12} {:>12} {:>6} {:>12} {:>12} {:>12} {:>6} {:>12} {:>6} {:>8}  {:<10} {}\n", "step",
                  "time", "compute", "%", "comm", "overlapped", "exposed", "%", "free", "%", "overlap%", "exposed",
                  "free");
  for (const auto& rk : r.ranks) {
    out += "\n";
    out += st.paint(fmt::format("rank {}", rk.rank), "1");
    out += fmt::format("  {} ({})\n", rk.file, to_string(rk.format));
    if (!rk.has_device_activity) {
      out += fmt::format("  {:<22} no device activity: {} events, none on a device stream (a CPU-only trace?)\n",
                         "whole trace", rk.events);
    } else {
      out += header;
      for (const auto& s : rk.steps) step_row(out, st, s.name, s);
      step_row(out, st, rk.steps.empty() ? rk.total.name : "total", rk.total);
      host_evidence(out, rk);
      late_waits(out, rk);
      comm_groups(out, rk);
      comm_ops(out, rk);
      pipeline(out, rk);
    }
    if (rk.malformed_events > 0 || rk.zero_ts_events > 0)
      out += fmt::format("  data quality: {} malformed event(s) skipped or repaired; {} event(s) at ts 0 left out of "
                         "the window\n",
                         rk.malformed_events, rk.zero_ts_events);
    for (const auto& n : rk.notes) out += fmt::format("  note: {}\n", n);
    if (!rk.top_kernels.empty() && r.ranks.size() > 1) {
      out += "  top kernels of this rank:\n";
      kernels(out, rk.top_kernels, "    ");
    }
  }

  // Rank balance (msprof-analyze's slow-rank rule) and compute balance over the ranks with device activity.
  if (const auto b = report::rank_balance(r))
    out += "\n" + b->figures + ": " + (b->flagged ? st.paint(b->verdict, "31") : b->verdict) + "\n";
  if (const auto b = report::compute_balance(r))
    out += b->figures + ": " + (b->flagged ? st.paint(b->verdict, "33") : b->verdict) + "\n";
  const auto& top = !r.top_kernels.empty() ? r.top_kernels
                    : r.ranks.size() == 1  ? r.ranks[0].top_kernels
                                           : std::vector<KernelStat>{};
  if (!top.empty()) {
    out += fmt::format("\ntop {} kernels by total device time{}:\n", top.size(), r.ranks.size() > 1 ? " (all ranks)" : "");
    kernels(out, top, "  ");
  }
  return out;
}

}  // namespace coc::analysis
