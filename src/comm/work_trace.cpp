// The trace event of one collective (work_state.h, trace_completed): from post (WorkState::start) to the moment
// the progress engine saw it complete (WorkState::end). Both are steady_clock time points, the tracer's clock.
// "Detected" matters: with the inline engine a collective that finished during a GEMM chunk is seen only at the
// next poll, so the event ends there, as a profiler that samples completion would draw it.
#include "coc/runtime/tracer.h"
#include "work_state.h"

namespace coc {

void trace_completed(const WorkState& w) {
  if (!trace::enabled(trace::Level::kLevel0)) return;
  trace::Record r;
  r.cat = trace::Cat::kComm;
  r.track = trace::Track::kComm;
  r.begin_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(w.start.time_since_epoch()).count();
  r.end_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(w.end.time_since_epoch()).count();
  r.name = trace::intern(w.desc.op);
  r.context = trace::intern(w.desc.comm);
  r.add("bytes", w.desc.bytes);
  r.add("seq", static_cast<int64_t>(w.desc.seq));
  r.add("group_root", static_cast<int64_t>(w.group_root));  // (comm, group_root, seq) names one op on every rank
  if (!w.desc.tag.empty()) r.set_label("tag", w.desc.tag);
  trace::record(trace::Level::kLevel0, r);
}

}  // namespace coc
