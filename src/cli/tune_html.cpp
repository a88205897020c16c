// `coc tune --report FILE` (tune_report.h): one self-contained HTML page (no scripts, no external files) in the style
// of `coc analyze --html` (analysis::report::html_style, xml_escape): the figures, the decision path drawn as inline
// SVG (baseline, then every tried switch: the kept ones on the path, the rejected ones branching off it), every step
// with its figures and reason, the confirmation and the verify section.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "coc/analysis/report_text.h"
#include "cli/tune_report.h"

namespace coc::cli {

using nlohmann::json;
using analysis::report::xml_escape;

namespace {

constexpr int kRowH = 40, kNodeH = 28, kSpineX = 10, kBranchX = 420, kNodeW = 380, kSvgW = kBranchX + kNodeW + 10;
constexpr size_t kMaxLabel = 52;  ///< characters of a switch in a node (monospace 12px); the full one is its title

std::string step_switch(const TuneStep& s) {
  if (!s.cand.keys.empty()) return s.cand.label();
  return family_label(s.cand.family);
}

std::string short_label(const std::string& s) {
  return s.size() <= kMaxLabel ? s : s.substr(0, kMaxLabel - 1) + "…";
}

/// One node: a rounded box at (x, y) with a title (hover text) and one line of text.
std::string node(int x, int y, const std::string& cls, const std::string& text, const std::string& title) {
  return fmt::format("<g class=\"{}\"><title>{}</title><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"6\"/>"
                     "<text x=\"{}\" y=\"{}\">{}</text></g>\n",
                     cls, xml_escape(title), x, y, kNodeW, kNodeH, x + 8, y + 18, xml_escape(short_label(text)));
}

/// The decision path: the baseline on top, each tried switch one row lower; a kept one extends the path (the
/// vertical spine on the left), a rejected one branches off to the right from the best it was tried against; the
/// last node is the result (tuned and confirmed, or the baseline returned).
std::string decision_svg(const TuneResult& r) {
  std::vector<const TuneStep*> tried;
  for (const TuneStep& s : r.steps)
    if (s.status == "kept" || s.status == "rejected") tried.push_back(&s);
  const int rows = static_cast<int>(tried.size()) + 2;
  const int h = rows * kRowH + 10;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"path\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"monospace\" font-size=\"12\">\n<style>rect{{fill:#fff;stroke-width:1.5}}"
      ".base rect,.end rect{{stroke:#4e79a7;fill:#eef3f8}}.kept rect{{stroke:#1a7f37;fill:#eaf5ec}}"
      ".rejected rect{{stroke:#cf222e;stroke-dasharray:4 3}}.rejected text{{fill:#555}}"
      "line.spine{{stroke:#1a7f37;stroke-width:2.5}}line.branch{{stroke:#cf222e;stroke-dasharray:4 3}}</style>\n",
      kSvgW, h, kSvgW, h);
  const int cx = kSpineX + 24, y_end = (rows - 1) * kRowH + 5;
  svg += fmt::format("<line class=\"spine\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n", cx, 5 + kNodeH, cx, y_end);
  // The confirmation's figure when there is one: it ran beside the tuned configuration, where the first run also
  // paid the process's start (primitives, auto's timing) and whatever load the machine had then.
  const double base_ms = r.confirmed ? r.confirm_ms_baseline : r.baseline_ms;
  std::string nodes = node(kSpineX, 5, "base", fmt::format("baseline {:.1f} ms", base_ms),
                           fmt::format("baseline: {:.1f} ms per iteration ({}), peak RSS {:.0f} MiB", base_ms,
                                       r.confirmed ? "in the confirmation run" : "its own run",
                                       r.baseline_peak_mib));
  for (size_t i = 0; i < tried.size(); ++i) {
    const TuneStep& s = *tried[i];
    const int y = static_cast<int>(i + 1) * kRowH + 5;
    const std::string sw = step_switch(s);
    const std::string title = fmt::format("{}: {:.1f} -> {:.1f} ms, pairs {:.3f}x (IQR {:.3f}), peak {:.0f} MiB; {} "
                                          "({})", sw, s.ms_before, s.ms_after, s.ratio, s.iqr, s.peak_mib, s.status,
                                          s.reason);
    const std::string text = fmt::format("{} {:.3f}x {}", s.status == "kept" ? "+" : "x", s.ratio, sw);
    if (s.status == "kept") {
      nodes += node(kSpineX, y, "kept", text, title);
    } else {
      svg += fmt::format("<line class=\"branch\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n", cx, y + kNodeH / 2,
                         kBranchX, y + kNodeH / 2);
      nodes += node(kBranchX, y, "rejected", text, title);
    }
  }
  std::string end = r.returned_baseline ? fmt::format("baseline returned ({:.3f}x slower)", r.confirm_ratio)
                    : r.chosen.empty()  ? std::string("baseline: no switch kept")
                    : r.confirmed ? fmt::format("tuned {:.1f} ms, confirmed {:.3f}x", r.confirm_ms_tuned, r.confirm_ratio)
                                  : std::string("tuned");
  return svg + nodes + node(kSpineX, y_end, "end", end, end) + "</svg>\n";
}

const char* status_class(const std::string& status) {
  return status == "kept" ? "ok" : status == "rejected" ? "bad" : "warn";
}

std::string steps_table(const TuneResult& r) {
  std::string out = "<table><tr><th>#</th><th>switch</th><th>communicator</th><th>compared by</th><th>ms best</th>"
                    "<th>ms candidate</th><th>pairs best/cand</th><th>IQR</th><th>to beat</th><th>peak MiB</th>"
                    "<th>result</th><th>why</th></tr>\n";
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const TuneStep& s = r.steps[i];
    const bool ran = s.status == "kept" || s.status == "rejected";
    auto num = [&](double v, const char* f) { return ran ? fmt::format(fmt::runtime(f), v) : std::string(); };
    out += fmt::format("<tr><td>{}</td><td class=\"name\">{}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                       "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td class=\"name\">{}</td>"
                       "</tr>\n",
                       i + 1, xml_escape(step_switch(s)), s.cand.math_change ? " (math change)" : "",
                       xml_escape(s.cand.comm), ran ? (s.cand.whole_run ? "whole runs" : "alternating") : "",
                       num(s.ms_before, "{:.1f}"), num(s.ms_after, "{:.1f}"), num(s.ratio, "{:.3f}"),
                       num(s.iqr, "{:.3f}"), num(s.threshold, "{:.3f}"), num(s.peak_mib, "{:.0f}"),
                       status_class(s.status), xml_escape(s.status), xml_escape(s.reason));
  }
  return out + "</table>\n";
}

/// The verify section: its lines, then each rank's verdicts.
std::string verify_html(const TuneResult& r) {
  std::string out = "<h2>Verify</h2>\n";
  for (const std::string& line : verify_lines(r.verify)) out += "<p class=\"note\">" + xml_escape(line) + "</p>\n";
  if (r.verify.is_null() || !r.verify.contains("profile") || !r.verify["profile"].contains("ranks")) return out;
  out += "<table><tr><th>rank</th><th>exposed %</th><th>exposed</th><th>free %</th><th>free</th></tr>\n";
  for (const json& k : r.verify["profile"]["ranks"]) {
    const std::string ex = k["exposed"].get<std::string>(), fr = k["free"].get<std::string>();
    out += fmt::format("<tr><td>{}</td><td>{:.1f}</td><td class=\"{}\">{}</td><td>{:.1f}</td><td class=\"{}\">{}</td>"
                       "</tr>\n",
                       k["rank"].get<int>(), k["exposed_pct"].get<double>(),
                       ex == "ok" ? "ok" : ex == "watch" ? "warn" : "bad", xml_escape(ex), k["free_pct"].get<double>(),
                       fr == "ok" ? "ok" : "warn", xml_escape(fr));
  }
  return out + "</table>\n";
}

}  // namespace

std::string tune_html(const TuneOptions& o, const TuneResult& r) {
  std::string out = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>coc tune</title>\n<style>\n{}\n"
      "</style></head><body>\n<h1>coc tune</h1>\n",
      analysis::report::html_style());
  out += fmt::format("<p>{:.0f} s of a {:g} min budget. Keep rule: the median of the pairs' ratios best/candidate "
                     "&gt; 1 + max(0.02, IQR/2). Baseline's first run: {:.1f} ms per iteration, peak RSS {:.0f} MiB per rank "
                     "(each step and the confirmation compare within their own runs). "
                     "Written: {}.</p>\n",
                     r.seconds, o.budget_minutes, r.baseline_ms, r.baseline_peak_mib, xml_escape(o.out));
  if (!r.profile_line.empty()) out += "<p class=\"note\">" + xml_escape(r.profile_line) + "</p>\n";
  out += "<h2>Decision path</h2>\n<p class=\"note\">Top to bottom in the order tried; kept switches (green) extend "
         "the path, rejected ones (red, dashed) branch off the best they were tried against. Skipped and untried "
         "switches are in the table only.</p>\n";
  out += decision_svg(r);
  out += "<h2>Steps</h2>\n" + steps_table(r);
  if (r.confirmed)
    out += fmt::format("<p>Confirmation against the baseline{}: {:.1f} -&gt; {:.1f} ms, pairs {:.3f}x (IQR {:.3f}){}"
                       "</p>\n",
                       r.confirm_reused ? " (the one kept switch's own run, not repeated)" : "", r.confirm_ms_baseline, r.confirm_ms_tuned, r.confirm_ratio, r.confirm_iqr,
                       r.returned_baseline ? ": slower, so the baseline is returned" : "");
  out += verify_html(r);
  return out + "</body></html>\n";
}

}  // namespace coc::cli
