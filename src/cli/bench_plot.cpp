// bench_plot.h: the overlap chart, written by hand as SVG (one <rect> per bar, one <text> per label).
#include "cli/bench_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "coc/core/error.h"

namespace coc::cli::bench {

namespace {
std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}
}  // namespace

void write_overlap_svg(const std::string& path, const nlohmann::json& record) {
  const auto& rows = record.at("rows");
  double tmax = 1e-9;
  for (const auto& r : rows)
    tmax = std::max({tmax, r["t_serial_ms"]["median"].get<double>(), r["t_overlap_ms"]["max"].get<double>(),
                     r["t_ideal_ms"].get<double>()});
  const int label_w = 330, plot_w = 560, bar_h = 9, group_h = 3 * bar_h + 12, top = 50;
  const int height = top + static_cast<int>(rows.size()) * group_h + 40, width = label_w + plot_w + 90;
  auto x = [&](double ms) { return label_w + ms / tmax * plot_w; };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"10\" y=\"18\" font-size=\"14\">coc bench overlap: {} ({}), medians of {} reps, max over ranks</text>\n",
      width, height, esc(record.value("model", "")), esc(record.value("inputs", "")), record.value("reps", 0));
  const char* colors[] = {"#d62728", "#1f77b4", "#2ca02c"};
  const char* names[] = {"T_serial", "T_overlap", "T_ideal"};
  for (int i = 0; i < 3; ++i)
    s += fmt::format("<rect x=\"{}\" y=\"28\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"37\">{}</text>\n",
                     label_w + i * 110, colors[i], label_w + i * 110 + 14, names[i]);
  int y = top;
  for (const auto& r : rows) {
    const std::string label = fmt::format("{} {} {} N={}{}", r["problem"].get<std::string>(),
                                          r["op"].get<std::string>(), r["engine"].get<std::string>(),
                                          r["N"].get<int>(), r["fused"].get<bool>() ? " fused" : "");
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", label_w - 6, y + 2 * bar_h,
                     esc(label));
    const double v[3] = {r["t_serial_ms"]["median"].get<double>(), r["t_overlap_ms"]["median"].get<double>(),
                         r["t_ideal_ms"].get<double>()};
    for (int i = 0; i < 3; ++i) {
      const int by = y + i * bar_h;
      s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"/>\n", label_w, by,
                       std::max(0.5, x(v[i]) - label_w), bar_h - 1, colors[i]);
      if (i == 1)  // whisker: min–max of T_overlap
        s += fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{}\" y2=\"{}\" stroke=\"black\"/>\n",
                         x(r["t_overlap_ms"]["min"].get<double>()), x(r["t_overlap_ms"]["max"].get<double>()),
                         by + bar_h / 2, by + bar_h / 2);
      s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"9\">{:.2f}</text>\n", x(v[i]) + 4, by + bar_h - 1,
                       v[i]);
    }
    y += group_h;
  }
  s += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", label_w, label_w + plot_w,
                   y + 4, y + 4);
  s += fmt::format("<text x=\"{}\" y=\"{}\">0</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.2f} ms</text>\n",
                   label_w, y + 18, label_w + plot_w, y + 18, tmax);
  s += "</svg>\n";
  std::ofstream f(path);
  if (!f) throw_error(ErrorKind::kIo, "cannot write the plot to '{}': check the directory exists", path);
  f << s;
  if (!f) throw_error(ErrorKind::kIo, "writing '{}' failed (disk full?)", path);
}

}  // namespace coc::cli::bench
