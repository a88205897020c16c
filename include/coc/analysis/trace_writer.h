// Writes the tracer's records (runtime/tracer.h) as coc's Chrome trace-event JSON, with the "Overlap Analysis"
// process per rank, merged for all ranks into one file (docs/profiling.md is the format contract).
//
// Format lineage: Chrome's Trace Event Format (object form: "traceEvents" + "displayTimeUnit" + "otherData"; "X"
// complete events and "M" metadata), which Perfetto's JSON importer and chrome://tracing load; step events are
// named "ProfilerStep#<n>" like PyTorch/Kineto's; the four overlap lanes (Computing, Communication,
// Communication(Not Overlapped), Free) are those of Ascend msprof's "Overlap Analysis" process, computed with
// analysis/intervals.h exactly as `coc analyze` computes them from the file (docs/semantics.md §7).
//
// Times: records carry each rank's own steady-clock ns. The writer subtracts the rank's measured offset
// (comm/clock_sync.h) so every rank is on rank 0's clock, then subtracts the trace origin (the earliest aligned
// event of all ranks), and prints µs with exactly three decimals: the integer ns survive the round trip.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coc/analysis/intervals.h"
#include "coc/comm/communicator.h"
#include "coc/runtime/tracer.h"

namespace coc::analysis {

/// pid of rank R's "Overlap Analysis" process (pid R is the rank itself).
inline constexpr int kOverlapPidBase = 1000000;
/// Chrome tid of the first communication track; overlapping collectives go on kCommTid + 1, + 2, ...
inline constexpr int kCommTid = 2;
/// Chrome tid of the first track of sharded data parallelism's collectives (parallel/fsdp.h), then + 1, + 2, ...
inline constexpr int kFsdpTid = 64;
/// Chrome tid of the first track of pipeline stage transfers ("comm pp"), then + 1, + 2, ...: the exchanges on the
/// stage links and the stage's waits for a receive (is_pp_transfer).
inline constexpr int kPpTid = 96;

/// Names of the pipeline schedule's trace events (model/pipeline_schedule.cpp, docs/pipeline.md): its point-to-point
/// messages are exchanges on two-rank communicators named "pp-link-act" / "pp-link-grad", and the stage's wait for a
/// receive is a comm event "pp_recv_wait" (which names no communicator). Both count as the communicator row "pp" of
/// `coc analyze`, and the exposed part of the waits is its pipeline bubble (docs/analysis.md).
inline constexpr const char* kPpLinkPrefix = "pp-link";
inline constexpr const char* kPpRecvWaitEvent = "pp_recv_wait";
inline constexpr const char* kPpGroup = "pp";

/// True for a record of a pipeline stage transfer: a comm event on a "pp-link..." communicator, or a pp_recv_wait.
bool is_pp_transfer(const trace::Record& r);

/// One rank's records, on its own clock.
struct RankTrace {
  int rank = 0;
  int64_t clock_offset_ns = 0;  ///< this rank's clock − rank 0's clock (ns)
  std::vector<trace::Record> records;
};

/// The overlap analysis of one rank as written into the file: the four lanes as interval sets and the totals,
/// per step window and over all steps. Times are aligned, origin-relative ns.
struct OverlapLanes {
  struct Step {
    std::string name;  ///< "ProfilerStep#3"
    Interval window;
    OverlapBreakdown split;
    bool auto_timing = false;  ///< a trace::kAutoTimingEvent begins in the window (tracer.h: why it is set apart)
  };
  std::vector<Step> steps;  ///< in time order; one "whole trace" window when the records hold no step
  IntervalSet computing, communication, exposed, free;  ///< lane contents over all windows
  OverlapBreakdown total;   ///< sums over the windows
  OverlapBreakdown steady;  ///< sums over the windows without auto_timing (equal to total when none has it)
  int64_t host_work_free = 0;  ///< ns of `free` during which the host did traced host work (cat "host_work")
};

/// Computes the lanes of one rank from its records (compute and comm categories only; host and step events
/// only delimit the windows). `shift_ns` is subtracted from every record time (offset + origin).
OverlapLanes overlap_lanes(const std::vector<trace::Record>& records, int64_t shift_ns);

/// The JSON events of one rank (metadata, records, overlap lanes), comma-separated without brackets, so that
/// rank 0 can concatenate the fragments of all ranks. `origin_ns` is on rank 0's clock. Fills `lanes` if set.
std::string rank_events_json(const RankTrace& t, int64_t origin_ns, OverlapLanes* lanes = nullptr);

/// Header fields of the merged file ("otherData").
struct TraceMeta {
  int world_size = 1;
  std::vector<int> ranks;                 ///< profiled ranks
  std::vector<int64_t> clock_offsets_ns;  ///< per world rank
  std::vector<int64_t> clock_rtt_ns;      ///< per world rank: RTT of the sample kept (the offset's error bound ×2)
  std::string level;                      ///< "level0" / "level1"
  int64_t step_start = 0, step_end = -1;  ///< --profile-step-start/-end as given (-1: to the end)
  uint64_t dropped_events = 0;            ///< summed over ranks (the per-process cap was hit)
  /// --pipeline-model-parallel-size P, the micro-batches M per iteration and dp rank (global batch / (micro-batch
  /// × dp)) and the virtual stages V per rank (--num-virtual-stages-per-pipeline-rank): `coc analyze` puts the ideal
  /// bubble (P − 1)/(V·M + P − 1) next to the measured one. M = 0: unknown, not written; V written when > 1.
  int pipeline_stages = 1;
  int64_t micro_batches = 0;
  int virtual_stages = 1;
};

/// The whole document: {"traceEvents":[fragments...], "displayTimeUnit":"ns", "otherData":{...}}.
std::string trace_document(const TraceMeta& meta, const std::vector<std::string>& fragments);

/// Writes `text` to `path` atomically: `path.tmp.<pid>`, flush, fsync, rename. Throws kIo naming the path.
void write_file_atomically(const std::string& path, const std::string& text);

/// What write_merged_trace() returns on every rank.
struct MergedTraceResult {
  std::string path;          ///< the file written (same string on every rank)
  bool profiled = false;     ///< this rank recorded events
  OverlapBreakdown overlap;  ///< this rank's totals over its profiled steps
  int64_t host_work_free = 0;  ///< ns of overlap.free spent in traced host work (data, logging, checkpoint)
  int steps = 0;             ///< this rank's profiled steps
  OverlapBreakdown steady;   ///< this rank's totals over its profiled steps without auto's timing (OverlapLanes)
  std::vector<std::string> auto_timing_steps;  ///< names of the steps left out of `steady`, in time order
  uint64_t events = 0;       ///< this rank's records
};

/// Collective over `world` (every rank must call it, profiled or not): aligns, gathers each rank's JSON fragment
/// to rank 0 (MPI_Gatherv) and writes `dir/coc_trace_<UTC time>.json` there atomically. `records` are this rank's
/// (empty on ranks not profiled). Throws kIo if rank 0 cannot write the file (every rank then sees the error
/// through the error policy's abort), kComm on MPI failures, kInvalidArgument when a fragment exceeds 2 GiB.
MergedTraceResult write_merged_trace(Communicator& world, std::vector<trace::Record> records, const TraceMeta& meta,
                                     const std::string& dir);

}  // namespace coc::analysis
