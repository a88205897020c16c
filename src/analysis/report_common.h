// Helpers shared by the report renderers (report_*.cpp): unit conversion, percentages, escaping, the step
// number msprof-analyze puts in its Step column, and the mean step time used for the rank balance. Private to
// src/analysis; the renderers' public contract is include/coc/analysis/analyze.h.
#pragma once

#include <cstdint>
#include <string>

#include "coc/analysis/analyze.h"

namespace coc::analysis::report {

/// ns → µs as a double (the unit every renderer shows; HTA and msprof report µs).
inline double us(int64_t ns) { return static_cast<double>(ns) / 1000.0; }

/// part / whole in percent; 0 for an empty whole, so an empty step never prints NaN.
inline double pct(int64_t part, int64_t whole) { return whole > 0 ? 100.0 * static_cast<double>(part) / whole : 0.0; }

/// The trailing integer of a step name ("ProfilerStep#12" → "12", "iteration 3" → "3"); `ordinal` when the name
/// has none. msprof-analyze's Step column holds that number.
std::string step_number(const std::string& name, size_t ordinal);

/// Mean step time of a rank in ns: total window / number of steps (the whole window when there are none). The
/// rank-balance line compares these, as msprof-analyze's cluster step-trace view compares ranks.
int64_t mean_step_ns(const RankReport& r);

/// Escapes &, <, >, " and ' for XML/HTML text and attributes; control characters become U+FFFD, since XML 1.0
/// forbids them and event names from real traces carry some (edge case 24 of docs/edge-cases.md).
std::string xml_escape(const std::string& s);

/// Labels of the four timeline lanes (LaneSegment::lane), Ascend's "Overlap Analysis" thread names.
inline const char* lane_name(int lane) {
  static const char* names[] = {"Computing", "Communication", "Communication(Not Overlapped)", "Free"};
  return lane >= 0 && lane < 4 ? names[lane] : "?";
}

/// The <style> body of every coc HTML page (`coc analyze --html`, `coc plot`), so that they look alike.
const char* html_style();

/// Series colours of the SVG charts (Tableau 10, the analyze lanes' palette), cycled by index.
const char* series_color(size_t i);

/// What the Free time of a coc trace's rank was, in one line (no trailing newline): the traced host work inside it
/// by name, the rest (idle or untraced), and the longest Free intervals with the events around them and their
/// offset from the trace's start (µs below 1 ms), e.g. "free 41.2 ms (3.1%) = host work 30.0 ms (data 25.1 ms,
/// logging 4.9 ms) + idle 11.2 ms; longest: 8.1 ms at 1234.5 ms (after all_reduce, before gemm; data), ...". Empty
/// when the rank has no Free time or the trace is not coc's (other formats trace no host work).
std::string free_explanation(const RankReport& r);

/// The head line of a rank's pipeline bubble (RankReport::pipeline): what it measures and the ideal 1F1B bubble
/// (P − 1)/(M + P − 1) with P and M, or why the ideal is missing. No trailing newline.
std::string pipeline_heading(const PipelineReport& p);

/// One-line description of a convention, for the table header and the HTML page (docs/analysis.md).
const char* convention_summary(Convention c);

}  // namespace coc::analysis::report
