// Helpers shared by the report renderers; see report_common.h.
#include "report_common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <vector>

namespace coc::analysis::report {

std::string step_number(const std::string& name, size_t ordinal) {
  size_t end = name.size();
  while (end > 0 && std::isspace(static_cast<unsigned char>(name[end - 1]))) --end;
  size_t begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(name[begin - 1]))) --begin;
  if (begin == end) return std::to_string(ordinal);
  return name.substr(begin, end - begin);
}

std::optional<BalanceLine> rank_balance(const Report& r) {
  std::vector<const RankReport*> active;
  for (const auto& rk : r.ranks) {
    if (rk.format != r.ranks.front().format) return std::nullopt;  // several runs: no balance between them
    if (rk.has_device_activity) active.push_back(&rk);
  }
  if (active.size() < 2) return std::nullopt;
  auto [lo, hi] = std::minmax_element(active.begin(), active.end(), [](const RankReport* a, const RankReport* b) {
    return mean_step_ns(*a) < mean_step_ns(*b);
  });
  const int64_t min_ns = mean_step_ns(**lo), max_ns = mean_step_ns(**hi);
  const int slow = r.slowest_rank >= 0 ? r.slowest_rank : (*hi)->rank;
  const int fast = r.fastest_rank >= 0 ? r.fastest_rank : (*lo)->rank;
  return BalanceLine{fmt::format("rank balance: mean step {:.1f} µs (rank {}) to {:.1f} µs (rank {}), spread {:.1f}%",
                                 us(min_ns), fast, us(max_ns), slow, pct(max_ns - min_ns, min_ns)),
                     r.slow_rank ? fmt::format("slow rank {} (max > min × 1.05)", slow) : "balanced (max ≤ min × 1.05)",
                     r.slow_rank};
}

std::optional<BalanceLine> compute_balance(const Report& r) {
  if (r.least_compute_rank < 0 || r.most_compute_rank == r.least_compute_rank) return std::nullopt;
  const int64_t lo = r.least_compute_ns, hi = r.most_compute_ns;
  const bool unequal = r.unequal_compute;
  return BalanceLine{fmt::format("compute balance: computing {:.1f} µs (rank {}) to {:.1f} µs (rank {}), spread "
                                 "{:.1f}%",
                                 us(lo), r.least_compute_rank, us(hi), r.most_compute_rank, pct(hi - lo, lo)),
                     unequal ? "unequal (max > min × 1.05): a rank that computes less waits for the slower ranks in "
                               "the collectives they share"
                             : "equal (max ≤ min × 1.05)",
                     unequal};
}

std::string late_wait_line(const RankReport& r) {
  const StepReport& t = r.total;
  if (t.late_wait_ns < 0 || t.split.exposed <= 0) return {};
  std::string per_step;
  for (const StepReport& s : r.steps)
    per_step += fmt::format("{}{:.1f}%", per_step.empty() ? "" : ", ", pct(s.late_wait_ns, s.split.window));
  const int64_t after = t.split.exposed - t.late_wait_ns - r.unmatched_ns;
  return fmt::format("exposed while a later rank had not posted the collective: {:.1f} µs ({:.1f}% of the time{}), "
                     "{}; after every rank had posted: {:.1f} µs ({:.1f}%){}",
                     us(t.late_wait_ns), pct(t.late_wait_ns, t.split.window),
                     r.steps.size() > 1 ? "; per step " + per_step : "",
                     r.waited_for_rank >= 0
                         ? fmt::format("most of it for rank {} ({:.1f} µs)", r.waited_for_rank, us(r.waited_for_ns))
                         : std::string("no rank was late"),
                     us(after), pct(after, t.split.window),
                     r.unmatched_ns > 0 ? fmt::format("; in collectives no other rank of the file traced (a partial "
                                                      "--profile-ranks?): {:.1f} µs ({:.1f}%)",
                                                      us(r.unmatched_ns), pct(r.unmatched_ns, t.split.window))
                                        : std::string());
}

std::string free_explanation(const RankReport& r) {
  const StepReport& t = r.total;
  if (r.format != TraceFormat::kCoc || t.split.free <= 0) return {};
  auto ms = [](int64_t ns) {
    return ns < 1'000'000 ? fmt::format("{:.1f} µs", us(ns)) : fmt::format("{:.1f} ms", static_cast<double>(ns) / 1e6);
  };
  std::string out = fmt::format("free {} ({:.1f}%) = host work {}", ms(t.split.free), pct(t.split.free, t.split.window),
                                ms(t.host_work_ns));
  std::string parts;
  for (const HostWorkStat& h : r.host_work)
    if (h.free_ns > 0) parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", h.name, ms(h.free_ns));
  if (!parts.empty()) out += " (" + parts + ")";
  out += fmt::format(" + idle {}", ms(t.split.free - t.host_work_ns));
  for (size_t i = 0; i < r.free_gaps.size(); ++i) {
    const FreeGap& g = r.free_gaps[i];
    out += fmt::format("{} {} at {} (after {}, before {}{})", i == 0 ? "; longest:" : ",", ms(g.end_ns - g.begin_ns),
                       ms(g.begin_ns), g.after.empty() ? "the step start" : g.after,
                       g.before.empty() ? "the step end" : g.before, g.host_work.empty() ? "" : "; " + g.host_work);
  }
  return out;
}

int64_t mean_step_ns(const RankReport& r) {
  if (r.steps.empty()) return r.total.split.window;
  int64_t sum = 0;
  for (const auto& s : r.steps) sum += s.split.window;
  return sum / static_cast<int64_t>(r.steps.size());
}

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n')
          out += "\xEF\xBF\xBD";
        else
          out += c;
    }
  }
  return out;
}

const char* convention_summary(Convention c) {
  switch (c) {
    case Convention::kExact:
      return "exact: integer ns, events crossing a step boundary clipped to it, every step kept";
    case Convention::kHta:
      return "hta: events trimmed inward to whole us, last ProfilerStep dropped, memcpy/memset non-compute (HTA)";
    case Convention::kAscend:
      return "ascend: exact ns, memcpy/memset count as Free (msprof Overlap Analysis)";
  }
  return "?";
}

const char* html_style() {
  return "body{font-family:sans-serif;margin:16px;color:#222}table{border-collapse:collapse;margin:6px 0 14px}"
         "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right;font-size:13px}th{background:#eee}"
         "td:first-child,th:first-child,td.name{text-align:left}td.ok{color:#1a7f37}td.warn{color:#9a6700}td.bad{color:#cf222e;"
         "font-weight:bold}p.note{margin:2px 0;font-size:13px;color:#555}";
}

const char* series_color(size_t i) {
  static const char* colors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                 "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  return colors[i % 10];
}

std::string pipeline_heading(const PipelineReport& p) {
  const std::string ideal =
      p.ideal_bubble_pct()
          ? (p.virtual_stages > 1
                 ? fmt::format("ideal interleaved bubble (P − 1)/(V·M + P − 1) = {:.1f}% (P {}, V {}, M {})",
                               *p.ideal_bubble_pct(), p.stages, p.virtual_stages, p.micro_batches)
                 : fmt::format("ideal 1F1B bubble (P − 1)/(M + P − 1) = {:.1f}% (P {}, M {})", *p.ideal_bubble_pct(),
                               p.stages, p.micro_batches))
          : std::string("ideal unknown (the trace does not carry P and M)");
  return fmt::format("pipeline bubble (the stage waiting for a pp receive with nothing computing, {} wait(s)); {}",
                     p.waits, ideal);
}

}  // namespace coc::analysis::report
