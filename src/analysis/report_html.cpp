// `coc analyze --html`: one self-contained page (no scripts, no external files) with the SVG of render_svg, a
// table per rank and step with the verdicts, host-bound evidence, data-quality notes and the top kernels.
#include <fmt/format.h>

#include "coc/analysis/analyze.h"
#include "report_common.h"

namespace coc::analysis {

namespace {

using report::pct;
using report::us;
using report::xml_escape;

const char* verdict_class(const std::string& v) {
  if (v == "ok") return "ok";
  if (v == "needs work") return "bad";
  return "warn";
}

void step_tr(std::string& out, const StepReport& s, const std::string& name) {
  const OverlapBreakdown& b = s.split;
  const Verdict v = verdict_of(s);
  out += fmt::format("<tr><td>{}</td><td>{:.1f}</td><td>{:.1f}</td><td>{:.1f}%</td><td>{:.1f}</td><td>{:.1f}</td>"
                     "<td>{:.1f}</td><td>{:.1f}%</td><td>{:.1f}</td><td>{:.1f}%</td><td>{:.1f}%</td>"
                     "<td class=\"{}\">{}</td><td class=\"{}\">{}</td></tr>\n",
                     xml_escape(name), us(b.window), us(b.computing), pct(b.computing, b.window), us(b.communication),
                     us(b.overlapped), us(b.exposed), pct(b.exposed, b.window), us(b.free), pct(b.free, b.window),
                     b.overlap_pct(), verdict_class(v.exposed), xml_escape(v.exposed), verdict_class(v.free),
                     xml_escape(v.free));
}

void kernel_table(std::string& out, const std::vector<KernelStat>& ks) {
  out += "<table><tr><th>total µs</th><th>count</th><th>kind</th><th>kernel</th></tr>\n";
  for (const auto& k : ks)
    out += fmt::format("<tr><td>{:.1f}</td><td>{}</td><td>{}</td><td class=\"name\">{}</td></tr>\n", us(k.total_ns),
                       k.count, xml_escape(k.kind), xml_escape(k.name));
  out += "</table>\n";
}

// Which communicators the exposed communication came from (the table's "communication by communicator").
void comm_group_table(std::string& out, const std::vector<CommGroupStat>& gs) {
  if (gs.empty()) return;
  out += "<table><tr><th>communicator</th><th>collectives</th><th>communication µs</th><th>exposed µs</th>"
         "<th>exposed %</th><th>hidden %</th></tr>\n";
  for (const auto& g : gs)
    out += fmt::format("<tr><td class=\"name\">{}</td><td>{}</td><td>{:.1f}</td><td>{:.1f}</td><td>{:.0f}</td>"
                       "<td>{:.0f}</td></tr>\n",
                       xml_escape(g.name), g.count, us(g.communication_ns), us(g.exposed_ns),
                       pct(g.exposed_ns, g.communication_ns), pct(g.communication_ns - g.exposed_ns, g.communication_ns));
  out += "</table>\n";
}

// Which operations the exposed communication came from (the table's "exposed communication by operation"), every row.
void comm_op_table(std::string& out, const std::vector<CommOpStat>& ops) {
  if (ops.empty()) return;
  const bool waits = ops.front().late_wait_ns >= 0;  // known for every row or none (metrics_wait.cpp)
  out += "<p>exposed communication by operation (layers.&lt;i&gt;. folded into layers.*.; ops may be exposed at "
         "once)</p>\n<table><tr><th>operation</th><th>collective</th><th>communicator</th><th>events</th>"
         "<th>communication µs</th><th>exposed µs</th><th>exposed %</th>";
  out += waits ? "<th>waiting for a later rank µs</th></tr>\n" : "</tr>\n";
  for (const auto& o : ops)
    out += fmt::format("<tr><td class=\"name\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1f}</td><td>{:.1f}</td>"
                       "<td>{:.0f}</td>{}</tr>\n",
                       xml_escape(o.op.empty() ? "(untagged)" : o.op), xml_escape(o.collective),
                       xml_escape(o.communicator), o.count, us(o.communication_ns), us(o.exposed_ns),
                       pct(o.exposed_ns, o.communication_ns),
                       waits ? fmt::format("<td>{:.1f}</td>", us(o.late_wait_ns)) : "");
  out += "</table>\n";
}

// The pipeline bubble per step, with the ideal 1F1B bubble (the table's "pipeline bubble").
void pipeline_table(std::string& out, const RankReport& rk) {
  if (!rk.pipeline) return;
  out += fmt::format("<p>{}</p>\n<table><tr><th>step</th><th>bubble µs</th><th>% of the step</th></tr>\n",
                     xml_escape(report::pipeline_heading(*rk.pipeline)));
  auto row = [&](const std::string& name, const StepReport& s) {
    out += fmt::format("<tr><td>{}</td><td>{:.1f}</td><td>{:.1f}%</td></tr>\n", xml_escape(name), us(s.pp_bubble_ns),
                       pct(s.pp_bubble_ns, s.split.window));
  };
  for (const StepReport& s : rk.steps) row(s.name, s);
  row(rk.steps.empty() ? rk.total.name : "total", rk.total);
  out += "</table>\n";
}

}  // namespace

std::string render_html(const Report& r) {
  std::string out = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>coc analyze</title>\n<style>\n{}\n"
      "</style></head><body>\n",
      report::html_style());
  out += fmt::format("<h1>coc analyze</h1>\n<p>{} rank(s); convention {}. Times in µs; percentages of the step; "
                     "overlap% = overlapped / communication (HTA). Verdicts (MindSpeed-LLM): exposed communication "
                     "≤ 10% ok, &gt; 20% needs work; free &lt; 3% ok, else host-bound?</p>\n",
                     r.ranks.size(), xml_escape(report::convention_summary(r.convention)));
  out += render_svg(r);
  for (const auto& rk : r.ranks) {
    out += fmt::format("<h2>rank {}</h2>\n<p class=\"note\">{} ({})</p>\n", rk.rank, xml_escape(rk.file),
                       to_string(rk.format));
    if (!rk.has_device_activity) {
      out += fmt::format("<p><b>no device activity</b>: {} events, none on a device stream.</p>\n", rk.events);
    } else {
      out += "<table><tr><th>step</th><th>time</th><th>compute</th><th>%</th><th>comm</th><th>overlapped</th>"
             "<th>exposed</th><th>%</th><th>free</th><th>%</th><th>overlap%</th><th>exposed</th><th>free</th></tr>\n";
      for (const auto& s : rk.steps) step_tr(out, s, s.name);
      step_tr(out, rk.total, rk.steps.empty() ? rk.total.name : "total");
      out += "</table>\n";
      const StepReport& t = rk.total;
      if (t.split.free > 0 && rk.format == TraceFormat::kCoc)
        out += fmt::format("<p class=\"note\">{}</p>\n", xml_escape(report::free_explanation(rk)));
      else if (t.split.free > 0)
        out += fmt::format("<p class=\"note\">host-bound evidence: device idle {:.1f} µs ({:.1f}%); {} idle gap(s) "
                           "ended by a late launch ({:.1f} µs); launch queue mean {:.2f}, max {}; {}/{} kernels "
                           "shorter than their launch call</p>\n",
                           us(t.split.free), pct(t.split.free, t.split.window), t.idle_gaps, us(t.idle_gap_ns),
                           t.launch_queue_mean, t.launch_queue_max, t.short_kernels, t.kernels);
      if (const std::string w = report::late_wait_line(rk); !w.empty())
        out += fmt::format("<p class=\"note\">{}</p>\n", xml_escape(w));
      comm_group_table(out, rk.comm_groups);
      comm_op_table(out, rk.comm_ops);
      pipeline_table(out, rk);
    }
    if (rk.malformed_events > 0 || rk.zero_ts_events > 0)
      out += fmt::format("<p class=\"note\">data quality: {} malformed event(s) skipped or repaired; {} event(s) at "
                         "ts 0 left out of the window</p>\n",
                         rk.malformed_events, rk.zero_ts_events);
    for (const auto& n : rk.notes) out += fmt::format("<p class=\"note\">note: {}</p>\n", xml_escape(n));
  }
  // The table's balance lines; a flagged verdict in bold.
  for (const auto& b : {report::rank_balance(r), report::compute_balance(r)})
    if (b)
      out += fmt::format("<p{}>{}: {}</p>\n", b->flagged ? " class=\"bad\"" : "", xml_escape(b->figures),
                         b->flagged ? "<b>" + xml_escape(b->verdict) + "</b>" : xml_escape(b->verdict));
  const auto& top = !r.top_kernels.empty() ? r.top_kernels
                    : r.ranks.size() == 1  ? r.ranks[0].top_kernels
                                           : std::vector<KernelStat>{};
  if (!top.empty()) {
    out += "<h2>top kernels</h2>\n";
    kernel_table(out, top);
  }
  out += "</body></html>\n";
  return out;
}

}  // namespace coc::analysis
