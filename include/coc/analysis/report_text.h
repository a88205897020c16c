// What the analysis's reports say in words, for other commands' pages (coc tune's report): HTML escaping, the
// style every coc HTML page shares, and the explanation of a rank's free time.
#pragma once

#include <string>

#include "coc/analysis/analyze.h"

namespace coc::analysis::report {

/// Escapes &, <, >, " and ' for XML/HTML text and attributes; control characters become U+FFFD, since XML 1.0
/// forbids them and event names from real traces carry some (edge case 24 of docs/edge-cases.md).
std::string xml_escape(const std::string& s);

/// The <style> body of every coc HTML page (`coc analyze --html`, `coc plot`), so that they look alike.
const char* html_style();

/// What the Free time of a coc trace's rank was, in one line (no trailing newline): the traced host work inside it
/// by name, the rest (idle or untraced), and the longest Free intervals with the events around them and their
/// offset from the trace's start (µs below 1 ms), e.g. "free 41.2 ms (3.1%) = host work 30.0 ms (data 25.1 ms,
/// logging 4.9 ms) + idle 11.2 ms; longest: 8.1 ms at 1234.5 ms (after all_reduce, before gemm; data), ...". Empty
/// when the rank has no Free time or the trace is not coc's (other formats trace no host work).
std::string free_explanation(const RankReport& r);

}  // namespace coc::analysis::report
