// The metrics of one rank (internal to src/analysis/): metrics_overlap.cpp (the four-lane split per step,
// host-bound evidence, top kernels, timeline lanes) and metrics_hta.cpp (HTA's figures and its step filter).
#pragma once

#include "coc/analysis/analyze.h"
#include "trace_model.h"

namespace coc::analysis::detail {

/// HTA's _filter_irrelevant_gpu_kernels (hta/common/trace.py): with two or more distinct ProfilerStep names,
/// keep host events that start before the last step starts and the device events whose correlation id
/// matches one of them; the last step itself is dropped. Returns true when it filtered. HTA counts the distinct
/// step names over all ranks it loads; we count them per file (the same on every fixture we have).
bool apply_hta_step_filter(RankTrace& rt, const NameTable& names);

/// HTA's temporal breakdown, per-stream idle-time breakdown and queue length, and kernel launch statistics,
/// on `rt`'s events (already rounded and filtered under kHta).
void fill_hta_figures(const RankTrace& rt, const NameTable& names, Convention conv, RankReport& out);

/// Steps, total, lanes, host-bound evidence, top kernels, vendor lanes.
void fill_overlap(const RankTrace& rt, const NameTable& names, const AnalyzeOptions& opt, RankReport& out);

/// Cross-rank: StepReport::late_wait_ns of every rank whose trace gives each collective's group and sequence
/// number (RankReport::posts), matched only between ranks of one file (one clock). metrics_wait.cpp.
void fill_late_waits(std::vector<RankReport>& ranks);

/// Whether a device event of this kind keeps the device busy under `conv` (kAscend: memcpy and sync are Free).
bool counts_as_busy(Kind k, Convention conv);

}  // namespace coc::analysis::detail
