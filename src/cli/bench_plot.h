// The SVG chart of `coc bench overlap --plot FILE.svg`: one group per result row (problem, op, engine, N, fused),
// three horizontal bars each: T_serial, T_overlap (median, with a min–max whisker) and T_ideal, in ms on a
// shared axis. Plain SVG 1.1 text, no library: it opens in any browser.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace coc::cli::bench {

/// Writes the chart of `record["rows"]` (the bench overlap JSON record) to `path`. Throws kIo naming the path when
/// it cannot be written.
void write_overlap_svg(const std::string& path, const nlohmann::json& record);

}  // namespace coc::cli::bench
