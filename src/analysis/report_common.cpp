// Helpers shared by the report renderers; see report_common.h.
#include "report_common.h"

#include <cctype>

namespace coc::analysis::report {

std::string step_number(const std::string& name, size_t ordinal) {
  size_t end = name.size();
  while (end > 0 && std::isspace(static_cast<unsigned char>(name[end - 1]))) --end;
  size_t begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(name[begin - 1]))) --begin;
  if (begin == end) return std::to_string(ordinal);
  return name.substr(begin, end - begin);
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

}  // namespace coc::analysis::report
