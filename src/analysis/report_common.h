// Helpers shared by the report renderers (report_*.cpp): unit conversion, percentages, the step number
// msprof-analyze puts in its Step column, and the mean step time used for the rank balance. Private to
// src/analysis; the renderers' public contract is include/coc/analysis/analyze.h, and the helpers other commands'
// pages use (escaping, the page style, the free-time explanation) are in include/coc/analysis/report_text.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "coc/analysis/analyze.h"
#include "coc/analysis/report_text.h"

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

/// Labels of the four timeline lanes (LaneSegment::lane), Ascend's "Overlap Analysis" thread names.
inline const char* lane_name(int lane) {
  static const char* names[] = {"Computing", "Communication", "Communication(Not Overlapped)", "Free"};
  return lane >= 0 && lane < 4 ? names[lane] : "?";
}

/// Series colours of the SVG charts (Tableau 10, the analyze lanes' palette), cycled by index.
const char* series_color(size_t i);

/// The head line of a rank's pipeline bubble (RankReport::pipeline): what it measures and the ideal 1F1B bubble
/// (P − 1)/(M + P − 1) with P and M, or why the ideal is missing. No trailing newline.
std::string pipeline_heading(const PipelineReport& p);

/// A cross-rank balance line: its figures, then its verdict (which the table colours when `flagged`).
struct BalanceLine {
  std::string figures;  ///< "rank balance: mean step … spread 3.1%"
  std::string verdict;  ///< "balanced (max ≤ min × 1.05)", "slow rank 1 (max > min × 1.05)", ...
  bool flagged = false;
};
/// The mean step times of the ranks with device activity (msprof-analyze's slow-rank rule); nullopt for fewer than
/// two such ranks or traces of several formats (several runs).
std::optional<BalanceLine> rank_balance(const Report& r);
/// Their Computing over the analysed steps (Report::least_compute_rank ...); nullopt where rank_balance is, or
/// when one rank computes least and most.
std::optional<BalanceLine> compute_balance(const Report& r);

/// One line on how much of a rank's exposed communication waited for a later rank (StepReport::late_wait_ns), per
/// step when there are several, and whom it waited for most; "" when that is unknown or nothing was exposed. No
/// trailing newline.
std::string late_wait_line(const RankReport& r);

/// One-line description of a convention, for the table header and the HTML page (docs/analysis.md).
const char* convention_summary(Convention c);

}  // namespace coc::analysis::report
