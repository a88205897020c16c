// Verdicts against MindSpeed-LLM's tuning guide (docs/semantics.md §7): not-overlapped communication up to 10% of the
// step is normal and above 20% needs work; Free under 3% is normal, more usually means a host-bound step.
// Also the names of the enums.
#include "coc/analysis/analyze.h"

namespace coc::analysis {

const char* to_string(TraceFormat f) {
  switch (f) {
    case TraceFormat::kAuto: return "auto";
    case TraceFormat::kCoc: return "coc";
    case TraceFormat::kKineto: return "kineto";
    case TraceFormat::kAscend: return "ascend";
    case TraceFormat::kTorchCpu: return "torch-cpu";
  }
  return "auto";
}

const char* to_string(Convention c) {
  switch (c) {
    case Convention::kExact: return "exact";
    case Convention::kHta: return "hta";
    case Convention::kAscend: return "ascend";
  }
  return "exact";
}

Verdict verdict_of(const StepReport& s) {
  Verdict v;
  const double w = static_cast<double>(s.split.window);
  const double exposed = w > 0 ? 100.0 * static_cast<double>(s.split.exposed) / w : 0;
  const double free = w > 0 ? 100.0 * static_cast<double>(s.split.free) / w : 0;
  v.exposed = exposed <= 10.0 ? "ok" : exposed <= 20.0 ? "watch" : "needs work";
  v.free = free < 3.0 ? "ok" : "host-bound?";
  return v;
}

}  // namespace coc::analysis
