// `coc plot`: training curves as SVG and HTML (include/coc/analysis/training_plot.h), drawn like `coc analyze`'s
// report_svg.cpp / report_html.cpp (same width, fonts, palette and page style, from report_common.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "coc/analysis/training_plot.h"
#include "coc/core/median.h"
#include "report_common.h"

namespace coc::analysis {

namespace {

using report::xml_escape;

constexpr double kWidth = 1200, kLeft = 90, kRight = 30, kChartH = 170, kGap = 52;
constexpr double kPlot = kWidth - kLeft - kRight;

struct Metric {
  const char* key;    ///< data-metric
  const char* title;  ///< chart title
  double TrainingPoint::*field;
};
constexpr Metric kMetrics[] = {
    {"loss", "lm loss (nats)", &TrainingPoint::loss},
    {"lr", "learning rate", &TrainingPoint::lr},
    {"grad_norm", "grad norm (before clipping)", &TrainingPoint::grad_norm},
    {"elapsed_ms", "ms per iteration", &TrainingPoint::elapsed_ms},
    {"tokens_per_s", "tokens/s", &TrainingPoint::tokens_per_s},
};

std::string num(double v) {
  const double a = std::fabs(v);
  if (v == 0) return "0";
  if (a >= 1e6 || a < 1e-2) return fmt::format("{:.2e}", v);
  if (a >= 100) return fmt::format("{:.0f}", v);
  return fmt::format("{:.4g}", v);
}

void text(std::string& out, double x, double y, const std::string& s, const char* extra = "") {
  out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\"{}>{}</text>\n", x, y, extra, xml_escape(s));
}

/// The validation losses of every run as circles on the loss chart (hollow, in the run's colour, so that the training
/// line stays visible through them); px and py map an iteration and a loss to the chart.
template <typename Px, typename Py>
std::string validation_marks(const std::vector<TrainingRun>& runs, const Px& px, const Py& py) {
  std::string out;
  for (size_t i = 0; i < runs.size(); ++i)
    for (const auto& [it, loss] : runs[i].validation)
      if (std::isfinite(loss))
        out += fmt::format("<circle class=\"validation\" data-run=\"{}\" cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"3.5\" "
                           "fill=\"white\" stroke=\"{}\" stroke-width=\"1.5\"><title>{}: validation loss {} at "
                           "iteration {}</title></circle>\n",
                           xml_escape(runs[i].label), px(it), py(loss), report::series_color(i),
                           xml_escape(runs[i].label), num(loss), it);
  return out;
}

}  // namespace

std::string render_training_svg(const std::vector<TrainingRun>& runs) {
  std::string body;
  double y = 28;
  text(body, 10, y, fmt::format("coc plot: training curves of {} run(s) against the iteration", runs.size()),
       " font-size=\"16\" font-weight=\"bold\"");
  y += 22;
  for (size_t i = 0; i < runs.size(); ++i) {
    body += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"12\" height=\"12\" fill=\"{}\"/>\n", kLeft + i * 230.0,
                        y - 10, report::series_color(i));
    text(body, kLeft + i * 230.0 + 16, y, runs[i].label);
  }
  y += 20;
  int64_t x_lo = std::numeric_limits<int64_t>::max(), x_hi = std::numeric_limits<int64_t>::min();
  bool any_validation = false;
  for (const auto& r : runs) {
    for (const auto& p : r.points) x_lo = std::min(x_lo, p.iteration), x_hi = std::max(x_hi, p.iteration);
    for (const auto& v : r.validation) x_lo = std::min(x_lo, v.first), x_hi = std::max(x_hi, v.first);
    any_validation = any_validation || !r.validation.empty();
  }
  if (x_lo > x_hi) x_lo = x_hi = 0;
  const double x_span = x_hi > x_lo ? static_cast<double>(x_hi - x_lo) : 1.0;
  auto px = [&](int64_t it) { return kLeft + (static_cast<double>(it - x_lo) / x_span) * kPlot; };

  for (const Metric& m : kMetrics) {
    y += 24;
    const bool loss_chart = m.field == &TrainingPoint::loss;
    text(body, 10, y, loss_chart && any_validation ? std::string(m.title) + "; circles: validation loss" : m.title,
         " font-weight=\"bold\"");
    const double top = y + 10;
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (const auto& r : runs) {
      for (const auto& p : r.points)
        if (std::isfinite(p.*m.field)) lo = std::min(lo, p.*m.field), hi = std::max(hi, p.*m.field);
      for (const auto& v : r.validation)
        if (loss_chart && std::isfinite(v.second)) lo = std::min(lo, v.second), hi = std::max(hi, v.second);
    }
    if (!(lo <= hi)) lo = 0, hi = 1;
    if (hi - lo < 1e-12 * std::max(1.0, std::fabs(hi))) lo -= 0.5 * std::max(std::fabs(lo), 1e-9), hi += 0.5 * std::max(std::fabs(hi), 1e-9);
    const double pad = 0.05 * (hi - lo);
    lo = lo >= 0 ? std::max(0.0, lo - pad) : lo - pad;  // times, rates and norms never dip below 0 on the axis
    hi += pad;
    auto py = [&](double v) { return top + kChartH - (v - lo) / (hi - lo) * kChartH; };
    body += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"#f4f4f4\"/>\n", kLeft,
                        top, kPlot, kChartH);
    for (int k = 0; k <= 4; ++k) {
      const double v = lo + (hi - lo) * k / 4.0, gy = py(v);
      body += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", kLeft, gy,
                          kLeft + kPlot, gy);
      text(body, kLeft - 6, gy + 4, num(v), " font-size=\"10\" fill=\"#555\" text-anchor=\"end\"");
    }
    for (size_t i = 0; i < runs.size(); ++i) {
      std::string pts;
      for (const auto& p : runs[i].points)
        if (std::isfinite(p.*m.field)) pts += fmt::format("{:.2f},{:.2f} ", px(p.iteration), py(p.*m.field));
      if (!pts.empty()) pts.pop_back();
      // Earlier runs are drawn wider, so that a later run on the same values (the same losses at N = 1 and N = 4)
      // shows as a thin line inside a wide one instead of hiding it.
      const double width = 1.5 + 2.0 * static_cast<double>(runs.size() - 1 - i) / std::max<double>(1, runs.size() - 1);
      body += fmt::format("<polyline class=\"series\" data-metric=\"{}\" data-run=\"{}\" points=\"{}\" fill=\"none\" "
                          "stroke=\"{}\" stroke-width=\"{:.1f}\"><title>{}: {}</title></polyline>\n",
                          m.key, xml_escape(runs[i].label), pts, report::series_color(i), width,
                          xml_escape(runs[i].label), m.title);
      if (runs[i].points.size() == 1)
        body += fmt::format("<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"2.5\" fill=\"{}\"/>\n",
                            px(runs[i].points[0].iteration), py(runs[i].points[0].*m.field), report::series_color(i));
    }
    if (loss_chart) body += validation_marks(runs, px, py);
    text(body, kLeft, top + kChartH + 13, fmt::format("iteration {}", x_lo), " font-size=\"10\" fill=\"#555\"");
    text(body, kLeft + kPlot, top + kChartH + 13, fmt::format("{}", x_hi),
         " font-size=\"10\" fill=\"#555\" text-anchor=\"end\"");
    y = top + kChartH + kGap - 24;
  }
  y += 10;
  return fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{:.0f}\" height=\"{:.0f}\" "
                     "viewBox=\"0 0 {:.0f} {:.0f}\" font-family=\"sans-serif\" font-size=\"13\">\n"
                     "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{}</svg>\n",
                     kWidth, y, kWidth, y, body);
}

std::string render_training_html(const std::vector<TrainingRun>& runs) {
  std::string out = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>coc plot</title>\n<style>\n{}\n"
      "</style></head><body>\n",
      report::html_style());
  out += fmt::format("<h1>coc plot</h1>\n<p>{} run(s) of <code>coc train --log-json</code>; medians over the logged "
                     "iterations.</p>\n",
                     runs.size());
  out += render_training_svg(runs);
  out += "<table><tr><th>run</th><th>iterations</th><th>first loss</th><th>last loss</th><th>median ms/iter</th>"
         "<th>median tokens/s</th><th>file</th></tr>\n";
  for (const auto& r : runs) {
    std::vector<double> ms, tps;
    for (const auto& p : r.points) ms.push_back(p.elapsed_ms), tps.push_back(p.tokens_per_s);
    out += fmt::format("<tr><td>{}</td><td>{}–{}</td><td>{:.4f}</td><td>{:.4f}</td><td>{:.1f}</td><td>{:.0f}</td>"
                       "<td class=\"name\">{}</td></tr>\n",
                       xml_escape(r.label), r.points.front().iteration, r.points.back().iteration,
                       r.points.front().loss, r.points.back().loss, median(ms), median(tps), xml_escape(r.file));
  }
  out += "</table>\n</body></html>\n";
  return out;
}

}  // namespace coc::analysis
