// Readers of the three trace formats (internal to src/analysis/).
//
// collect_trace() streams any Chrome trace-event file (object with "traceEvents", or a top-level array as in
// Ascend's trace_view.json) through JsonScanner and keeps, per event, only what the analysis needs
// (trace_model.h). The format-specific builders then give the kept events their roles:
//  - build_kineto (trace_reader_kineto.cpp): PyTorch/Kineto, 2021 and current schemas;
//  - build_ascend (trace_reader_ascend.cpp): torch_npu / msprof trace_view.json;
//  - build_coc    (trace_reader_coc.cpp): coc's own traces (docs/profiling.md), one RankTrace per rank;
//  - build_torch_cpu (trace_reader_torch_cpu.cpp): PyTorch profiler traces of CPU-only runs (no device events),
//    PyTorch 1.13's bare array and Kineto's object.
// Errors: ParseError (json_scanner.h) with the byte offset; the caller adds the file name.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "trace_model.h"

namespace coc::analysis::detail {

using ProgressFn = std::function<void(const std::string& file, uint64_t done, uint64_t total)>;

CollectedTrace collect_trace(const std::string& path, const ProgressFn& progress);

/// Which format the collected trace is (kAuto resolved): otherData.producer "coc" or coc categories → coc; array
/// top level → Ascend, unless no event belongs to an Ascend process and no event carries a "Task Type" (then
/// PyTorch's CPU-only bare array → torch-cpu); an object without device events but with CPU operators → torch-cpu;
/// otherwise Kineto.
TraceFormat detect_format(const CollectedTrace& t);

/// Times under `conv`: kHta uses HTA's inward-rounded whole µs, the others exact ns.
int64_t kept_begin(const RawKept& e, Convention conv);
int64_t kept_end(const RawKept& e, Convention conv);

/// Consumes t.events (popped as they are converted, so the raw and the converted records never both sit in
/// memory in full: the reader's peak stays near the larger of the two, not their sum).
std::vector<RankTrace> build_kineto(CollectedTrace& t, Convention conv);
std::vector<RankTrace> build_ascend(const CollectedTrace& t, Convention conv);
std::vector<RankTrace> build_coc(const CollectedTrace& t, Convention conv);
/// Consumes t.events and t.cpu_ops.
std::vector<RankTrace> build_torch_cpu(CollectedTrace& t, Convention conv);

}  // namespace coc::analysis::detail
