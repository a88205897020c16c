// `coc analyze --svg`: a self-contained SVG 1.1 image with (1) one stacked bar per rank splitting the analysed
// span into compute only, overlapped, Communication(Not Overlapped) and Free (docs/semantics.md §7), bars scaled to
// the longest rank so that imbalance shows, and (2) per rank a four-lane timeline with Ascend's Overlap Analysis
// lanes (Computing, Communication, Communication(Not Overlapped), Free) and the step boundaries.
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "coc/analysis/analyze.h"
#include "report_common.h"

namespace coc::analysis {

namespace {

using report::pct;
using report::xml_escape;

constexpr double kWidth = 1200, kLeft = 190, kRight = 30;
constexpr double kPlot = kWidth - kLeft - kRight;
constexpr std::array<const char*, 4> kLaneColor = {"#4e79a7", "#f28e2b", "#e15759", "#bab0ac"};
constexpr const char* kOverlapColor = "#59a14f";

void rect(std::string& out, double x, double y, double w, double h, const char* fill, const std::string& title = {}) {
  if (w <= 0) return;
  if (title.empty())
    out += fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\"/>\n", x, y, w, h, fill);
  else
    out += fmt::format("<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{:.1f}\" fill=\"{}\"><title>{}</title></rect>\n",
                       x, y, w, h, fill, xml_escape(title));
}

void text(std::string& out, double x, double y, const std::string& s, const char* extra = "") {
  out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\"{}>{}</text>\n", x, y, extra, xml_escape(s));
}

// Segments narrower than a pixel are merged with their neighbours on the same lane: the picture is the same and
// the file stays small for traces with hundreds of thousands of kernels.
void lane(std::string& out, const std::vector<LaneSegment>& segs, int which, int64_t t0, double ns_per_px, double y,
          double h) {
  double x0 = -1, x1 = -1;
  for (const auto& s : segs) {
    if (s.lane != which) continue;
    const double a = kLeft + (s.begin_ns - t0) / ns_per_px, b = kLeft + (s.end_ns - t0) / ns_per_px;
    if (x0 >= 0 && a <= x1 + 0.5) {
      x1 = std::max(x1, b);
      continue;
    }
    if (x0 >= 0) rect(out, x0, y, std::max(x1 - x0, 0.5), h, kLaneColor[static_cast<size_t>(which)]);
    x0 = a;
    x1 = b;
  }
  if (x0 >= 0) rect(out, x0, y, std::max(x1 - x0, 0.5), h, kLaneColor[static_cast<size_t>(which)]);
}

}  // namespace

std::string render_svg(const Report& r) {
  std::string body;
  double y = 28;
  text(body, 10, y, fmt::format("coc analyze: overlap of computation and communication ({} convention)",
                                to_string(r.convention)), " font-size=\"16\" font-weight=\"bold\"");
  y += 22;
  const char* legend[] = {"Computing only", "Overlapped", "Communication(Not Overlapped)", "Free"};
  const char* legend_color[] = {kLaneColor[0], kOverlapColor, kLaneColor[2], kLaneColor[3]};
  for (int i = 0; i < 4; ++i) {
    rect(body, kLeft + i * 230, y - 10, 12, 12, legend_color[i]);
    text(body, kLeft + i * 230 + 16, y, legend[i]);
  }
  y += 24;
  text(body, 10, y, "Split of the analysed span per rank (bar length: span, scaled to the longest rank)",
       " font-weight=\"bold\"");
  y += 10;

  int64_t longest = 1;
  for (const auto& rk : r.ranks) longest = std::max(longest, rk.total.split.window);
  for (const auto& rk : r.ranks) {
    const OverlapBreakdown& b = rk.total.split;
    text(body, 10, y + 15, fmt::format("rank {}", rk.rank));
    if (!rk.has_device_activity) {
      text(body, kLeft, y + 15, "no device activity", " fill=\"#666\"");
    } else {
      const double scale = kPlot / static_cast<double>(longest);
      double x = kLeft;
      const int64_t parts[] = {b.computing - b.overlapped, b.overlapped, b.exposed, b.free};
      for (int i = 0; i < 4; ++i) {
        const double w = parts[i] * scale;
        rect(body, x, y, w, 20, legend_color[i],
             fmt::format("rank {} {}: {:.1f} µs ({:.1f}%)", rk.rank, legend[i], report::us(parts[i]),
                         pct(parts[i], b.window)));
        x += w;
      }
      text(body, kLeft + 4, y + 34,
           fmt::format("{:.1f} µs: compute {:.1f}%, exposed comm {:.1f}%, free {:.1f}%, overlap {:.1f}%",
                       report::us(b.window), pct(b.computing, b.window), pct(b.exposed, b.window),
                       pct(b.free, b.window), b.overlap_pct()),
           " font-size=\"11\" fill=\"#333\"");
    }
    y += 44;
  }

  y += 16;
  text(body, 10, y, "Timeline per rank (each on its own clock; grey lines: step boundaries)", " font-weight=\"bold\"");
  y += 12;
  for (const auto& rk : r.ranks) {
    text(body, 10, y + 12, fmt::format("rank {}", rk.rank), " font-weight=\"bold\"");
    const int64_t t0 = rk.total.begin_ns, t1 = rk.total.end_ns;
    if (!rk.has_device_activity || t1 <= t0) {
      text(body, kLeft, y + 12, "no device activity", " fill=\"#666\"");
      y += 26;
      continue;
    }
    const double ns_per_px = static_cast<double>(t1 - t0) / kPlot;
    for (int l = 0; l < 4; ++l) {
      const double ly = y + 18 + l * 18;
      text(body, 20, ly + 11, report::lane_name(l), " font-size=\"11\"");
      rect(body, kLeft, ly, kPlot, 14, "#f4f4f4");
      lane(body, rk.lanes, l, t0, ns_per_px, ly, 14);
    }
    for (const auto& s : rk.steps) {
      const double x = kLeft + (s.begin_ns - t0) / ns_per_px;
      if (x < kLeft || x > kLeft + kPlot) continue;
      body += fmt::format("<line x1=\"{:.2f}\" y1=\"{:.1f}\" x2=\"{:.2f}\" y2=\"{:.1f}\" stroke=\"#888\" "
                          "stroke-dasharray=\"3,2\"/>\n", x, y + 16, x, y + 18 + 4 * 18);
    }
    text(body, kLeft, y + 18 + 4 * 18 + 12, "0", " font-size=\"10\" fill=\"#555\"");
    text(body, kLeft + kPlot, y + 18 + 4 * 18 + 12, fmt::format("{:.1f} ms", (t1 - t0) / 1e6),
         " font-size=\"10\" fill=\"#555\" text-anchor=\"end\"");
    y += 18 + 4 * 18 + 26;
  }
  return fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{:.0f}\" height=\"{:.0f}\" "
                     "viewBox=\"0 0 {:.0f} {:.0f}\" font-family=\"sans-serif\" font-size=\"13\">\n"
                     "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{}</svg>\n",
                     kWidth, y + 10, kWidth, y + 10, body);
}

}  // namespace coc::analysis
