// The overlap analysis of profiler traces: coc's own, PyTorch/Kineto (2021 and current formats) and Ascend
// (torch_npu trace_view.json). Definitions: docs/semantics.md §7 and docs/analysis.md; HTA's conventions are reproduced
// under Convention::kHta.
//
// This header is the contract between the trace readers / metric code (src/analysis/trace_*.cpp,
// metrics_*.cpp) and the renderers (src/analysis/report_*.cpp) and the CLI (`coc analyze`). All times are int64
// ns unless a name says otherwise. Readers stream the file and keep only what the analysis needs, so memory is
// bounded by the number of *device* events and launch calls, never by the file size (about 130 MB peak for a
// 1.1 GB Kineto trace with 0.5 M kernels).
//
// Where each rule comes from:
//  - what counts as compute / communication / memory / sync: src/analysis/event_classify.h (HTA's kernel-name
//    rules, hta/utils/utils.py; sync records are neither compute nor communication);
//  - which events are device events and how host calls link to them (args.stream, args.correlation):
//    src/analysis/trace_reader_kineto.cpp; Ascend roles by process name: trace_reader_ascend.cpp;
//  - HTA's temporal breakdown, idle-time breakdown, queue length and launch statistics, and its step filter:
//    src/analysis/metrics_hta.cpp; the four-lane split and the host-bound evidence: metrics_overlap.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "coc/analysis/intervals.h"

namespace coc::analysis {

enum class TraceFormat { kAuto, kCoc, kKineto, kAscend, kTorchCpu };
const char* to_string(TraceFormat f);

/// Where tools disagree, the choice is explicit (docs/analysis.md, "The three conventions").
enum class Convention {
  kExact,   ///< default: exact ns; events crossing a step boundary are clipped to it; every step is kept
  kHta,     ///< HTA @ f4d0062c: events trimmed inward to whole µs, last ProfilerStep dropped, memcpy/memset
            ///< are non-compute ("MEMORY"), sync events are neither compute nor communication
  kAscend,  ///< msprof: as kExact, but memcpy/memset count as Free (neither compute nor communication)
};
const char* to_string(Convention c);

/// Options of one analysis run (the flags of `coc analyze`).
struct AnalyzeOptions {
  Convention convention = Convention::kExact;
  TraceFormat format = TraceFormat::kAuto;
  /// Rank for files that carry none (edge case 26 of docs/edge-cases.md), by file path; otherwise the rank is taken
  /// from the trace (distributedInfo.rank, our "rank" metadata, Ascend's rank id), else from the file name ("rank-3",
  /// "rank_3", "worker3"), else the file gets rank -1 and a note.
  std::map<std::string, int> rank_of_file;
  int top_kernels = 10;        ///< how many kernels by total time to keep per rank
  size_t max_lane_segments = 20000;  ///< cap on lane segments kept per rank for timelines (merged beyond it)
  /// Called from the reading thread with (bytes consumed, total bytes) of one file; total is the compressed
  /// size for .gz files. May be empty.
  std::function<void(const std::string& file, uint64_t done, uint64_t total)> progress;
  int threads = 0;             ///< files parsed in parallel; 0 = hardware concurrency
};

/// The split of one rank inside one window (a ProfilerStep or the whole trace), plus HTA's overlap %.
struct StepReport {
  std::string name;        ///< "ProfilerStep#12", "iteration 3" or "whole trace"
  int64_t begin_ns = 0, end_ns = 0;
  OverlapBreakdown split;  ///< computing, communication (total), overlapped, exposed, free
  // Host-bound evidence (reported whenever the device is idle inside the window).
  int64_t idle_gaps = 0;            ///< device-idle gaps where the next launch call started after the device went idle
  int64_t idle_gap_ns = 0;          ///< their total length
  double launch_queue_mean = 0;     ///< mean outstanding launches when a kernel starts
  int64_t launch_queue_max = 0;
  int64_t short_kernels = 0;        ///< kernels whose device duration < their launch call's duration
  int64_t kernels = 0;
  /// coc traces: the part of `split.free` during which the host did traced work that is neither compute nor
  /// communication (cat "host_work": data, logging, checkpoint); the rest of Free is idle (or untraced) time.
  int64_t host_work_ns = 0;
  /// coc traces: a "coc_auto_timing" host event begins in this step (runtime/tracer.h, kAutoTimingEvent); the
  /// rank's notes then give the other steps' totals.
  bool auto_timing = false;
  /// coc traces of a pipelined run: the pipeline bubble, |(R \ C) ∩ W| with R the union of the stage's waits for a
  /// pp receive (events "pp_recv_wait") and C the compute union: the time the stage sat waiting for a neighbour with
  /// nothing to compute (docs/analysis.md, "Pipeline bubble"). Part of `split.exposed`. 0 without pipelining.
  int64_t pp_bubble_ns = 0;
  /// coc traces whose collectives carry group_root and seq: the part of `split.exposed` during which this rank waited
  /// in a collective that another rank of its group had not posted yet (docs/analysis.md, "Waiting for a later
  /// rank"; msprof's "Wait Time", the synchronization before the transfer). -1: not known (another format, an older
  /// coc trace, or a single rank).
  int64_t late_wait_ns = -1;
};

/// The pipeline of one rank's run, when the trace shows one (docs/analysis.md, "Pipeline bubble"): the measured
/// bubble is in StepReport::pp_bubble_ns (per step, and in RankReport::total); the ideal 1F1B bubble next to it.
struct PipelineReport {
  int64_t stages = 0;         ///< P, from the trace's metadata (otherData.pipeline_model_parallel_size); 0: unknown
  int64_t micro_batches = 0;  ///< M, from otherData.num_microbatches; 0: unknown
  int64_t virtual_stages = 1; ///< V, from otherData.num_virtual_stages_per_pipeline_rank; 1 when absent
  int64_t waits = 0;          ///< pp_recv_wait events of this rank in the analysed steps
  /// The ideal bubble (P − 1)/(V·M + P − 1) in percent of the step: each stage idles (P − 1)(t_f + t_b)/V of a
  /// step of (M + (P − 1)/V)(t_f + t_b) (Narayanan et al. 2021, §2.2.1 for 1F1B, V = 1, and §2.2.2 for the
  /// interleaved schedule, whose "bubble time fraction" (p − 1)/(v·m) divides by the ideal time m(t_f + t_b)
  /// instead). nullopt when the trace does not carry P and M.
  std::optional<double> ideal_bubble_pct() const {
    if (stages < 1 || micro_batches < 1 || virtual_stages < 1) return std::nullopt;
    return 100.0 * static_cast<double>(stages - 1) / static_cast<double>(virtual_stages * micro_batches + stages - 1);
  }
};

/// One of the longest Free intervals of a coc trace's analysed span, named by what surrounds it, so that a
/// "host-bound?" verdict says where the time went.
struct FreeGap {
  int64_t begin_ns = 0, end_ns = 0;
  std::string after;      ///< the compute or communication event that ended last before the gap ("" at a step start)
  std::string before;     ///< the one that starts where the gap ends ("" at a step end)
  std::string host_work;  ///< the host work that covers most of the gap ("" if none: the host was idle or untraced)
};

/// Traced host work inside Free, per name (coc traces).
struct HostWorkStat {
  std::string name;           ///< "data", "logging", "checkpoint", ...
  int64_t count = 0;          ///< events
  int64_t free_ns = 0;        ///< their time inside Free of the analysed span
};

/// HTA-style per-stream figures (anchors in traces/hta_anchor_values.json).
struct StreamStats {
  int64_t stream = 0;                 ///< device stream id (string tids like "stream 7" are parsed to 7)
  int64_t host_wait_ns = 0, kernel_wait_ns = 0, other_idle_ns = 0;  ///< HTA idle-time breakdown
  int64_t queue_samples = 0;          ///< HTA queue_length: number of samples
  double queue_mean = 0, queue_p50 = 0;
  int64_t queue_max = 0;
};

struct KernelStat {
  std::string name;
  std::string kind;   ///< "compute", "communication", "memory", "sync"
  int64_t count = 0;
  int64_t total_ns = 0;
};

/// The communication of one communicator (process group) over the analysed steps: which collectives the exposed
/// communication came from. The groups' exposed times can add up to more than the total's, where two groups'
/// collectives were exposed at the same moment.
struct CommGroupStat {
  std::string name;             ///< the communicator: coc's ("tp", "cp", "fsdp dp-cp", "pp", ...) or Kineto's process
                                ///< group. coc's pipeline links and waits count as "pp" (comm_group_row)
  int64_t count = 0;            ///< collectives (events) in the steps
  int64_t communication_ns = 0; ///< union of its collectives' intervals inside the steps
  int64_t exposed_ns = 0;       ///< the part of it no compute overlaps (msprof's "Communication(Not Overlapped)")
};

/// The communication of one operation over the analysed steps (coc traces: docs/analysis.md, "Exposed communication
/// per operation"): which layer op's collectives were exposed. An op is the tag its collectives carry with the chunk /
/// segment counters, send / recv qualifiers and the layer index removed ("layers.*.mlp.down fwd"), so every layer's
/// and every chunk's share of it add up. The ops' exposed times can add up to more than the total's, where two ops'
/// collectives were exposed at the same moment.
struct CommOpStat {
  std::string op;               ///< "layers.*.mlp.down bwd dX", "embedding fwd weight"; "" for untagged events
  std::string collective;       ///< the event name without its element type or exchange half: "all_gather",
                                ///< "reduce_scatter", "exchange", "all_reduce_max", "pp_recv_wait"
  std::string communicator;     ///< the communicator row (as CommGroupStat::name): "tp", "pp", ...; "" when none
  int64_t count = 0;            ///< events in the steps
  int64_t communication_ns = 0; ///< union of its events' intervals inside the steps
  int64_t exposed_ns = 0;       ///< the part of it no compute of the rank overlaps
  int64_t late_wait_ns = -1;    ///< the part of exposed_ns waiting for a later rank (StepReport::late_wait_ns), or -1
};

/// One lane segment for timelines: lane 0 Computing, 1 Communication, 2 Communication(Not Overlapped), 3 Free.
struct LaneSegment {
  uint8_t lane = 0;
  int64_t begin_ns = 0, end_ns = 0;
};

struct RankReport {
  int rank = -1;
  std::string rank_source;            ///< "distributedInfo", "mapping", "file name", "trace" (coc pid) or "none"
  std::string file;
  TraceFormat format = TraceFormat::kAuto;
  int64_t world_size = 0;             ///< coc traces: the run's world size (otherData.world_size); 0 when absent
  bool has_device_activity = false;   ///< false: print "no device activity" (edge case 27), never crash
  std::vector<StepReport> steps;      ///< per ProfilerStep (or per coc iteration); empty if the trace has none
  StepReport total;                   ///< over the analysed span (all kept steps, or the whole trace)
  // HTA figures under the chosen convention.
  int64_t kernel_time_ns = 0;         ///< HTA temporal_breakdown kernel_time (span of kept steps' device events)
  int64_t idle_time_ns = 0, compute_time_ns = 0, non_compute_time_ns = 0;
  std::vector<StreamStats> streams;
  int64_t launches = 0;               ///< kernel launch calls matched to kernels (HTA kernel_launch_stats n)
  double launch_delay_mean_us = 0;    ///< mean of max(0, device start − launch-call end), µs (HTA clips at 0); 0 when launches == 0
  int64_t launch_delay_gt_100us = 0, cpu_dur_gt_50us = 0;
  int64_t launch_short_kernels = 0;   ///< HTA "short kernels": device duration < launch-call duration
  std::vector<KernelStat> top_kernels;
  /// Per communicator, by exposed time, largest first; empty when the trace names no communicator (coc and Kineto
  /// traces name them; msprof's do not).
  std::vector<CommGroupStat> comm_groups;
  /// Per operation (op, collective, communicator), by exposed time, largest first; empty when no collective carries
  /// a tag (only coc's traces tag them).
  std::vector<CommOpStat> comm_ops;
  /// coc traces of a pipelined run (pp_recv_wait events, or P > 1 in the metadata); nullopt otherwise.
  std::optional<PipelineReport> pipeline;
  std::vector<LaneSegment> lanes;     ///< timeline of the four lanes, capped at max_lane_segments
  // coc traces only: what the Free time of `total` was (empty for other formats, which trace no host work).
  std::vector<HostWorkStat> host_work;  ///< by free_ns, largest first
  std::vector<FreeGap> free_gaps;       ///< the longest Free intervals, longest first (at most 3)
  // Ascend only: totals of the trace's own "Overlap Analysis" process, to compare with ours.
  std::optional<OverlapBreakdown> vendor_overlap_lanes;
  // Data-quality counters (edge cases 22, 24, 25).
  int64_t events = 0, device_events = 0;
  int64_t malformed_events = 0;       ///< skipped or repaired (bad strings, bad numbers)
  int64_t zero_ts_events = 0;         ///< ts: 0 events left out of the window
  std::vector<std::string> notes;     ///< human-readable remarks ("rank taken from file name", ...)
  bool hta_last_step_dropped = false; ///< Convention::kHta filtered the last ProfilerStep (HTA's default)
  /// The rank this one waited for longest in StepReport::late_wait_ns (the late rank of each wait), and for how long
  /// (exposed ns). -1 / 0 when late_wait_ns is unknown or 0.
  int waited_for_rank = -1;
  int64_t waited_for_ns = 0;
  /// The exposed time (over `total`) in collectives that no other rank of the file traced, outside the waits: a
  /// partial --profile-ranks, or keys that do not match. Neither a wait nor known to follow every rank's post.
  int64_t unmatched_ns = 0;

  /// Inputs of the cross-rank wait analysis (analyze_paths), coc traces only; not rendered. A collective as this rank
  /// saw it: its communicator (a name id of the rank's file), its comm_ops row, its collective key (one op of one group
  /// instance, the same on every rank of the group) and its post-to-completion interval.
  struct CollectivePost {
    uint32_t group = 0;
    int32_t op_row = -1;  ///< its row in comm_ops, or -1
    int64_t collective = -1;
    int64_t ts = 0, end = 0;
  };
  std::vector<CollectivePost> posts;
  std::vector<Interval> exposed_parts;  ///< exposed communication in the total's and the steps' windows, disjoint
};

/// Verdicts against MindSpeed-LLM's tuning thresholds (docs/semantics.md §7).
struct Verdict {
  std::string exposed;  ///< "ok" (≤ 10%), "watch" (10–20%), "needs work" (> 20%)
  std::string free;     ///< "ok" (< 3%), "host-bound?" (≥ 3%)
};
Verdict verdict_of(const StepReport& s);

struct Report {
  Convention convention = Convention::kExact;
  std::vector<RankReport> ranks;   ///< sorted by rank
  bool slow_rank = false;          ///< max step time > min × 1.05
  int slowest_rank = -1, fastest_rank = -1;
  /// Computing time over the analysed steps, least and most (one run's ranks: one format, device activity). With
  /// synchronous collectives the step times match whatever the ranks compute, so this is where an unequal rank shows
  /// (msprof-analyze compares Computing across ranks with the same 5% rule).
  int least_compute_rank = -1, most_compute_rank = -1;
  int64_t least_compute_ns = 0, most_compute_ns = 0;
  bool unequal_compute = false;    ///< most_compute_ns > least_compute_ns × 1.05 (the slow-rank rule)
  std::vector<KernelStat> top_kernels;  ///< across ranks
};

/// Analyses one file (plain or .gz; the format is detected unless AnalyzeOptions::format says it); a merged coc
/// trace holds several ranks, so the result is one report per rank. The rank of a single-rank file comes from
/// distributedInfo.rank, else from AnalyzeOptions::rank_of_file, else from the file name, else it is -1 with a
/// note (edge case 26). Malformed strings inside events are repaired or the event skipped, and counted
/// (malformed_events); events at ts 0 / dur 0 are counted (zero_ts_events) and left out.
/// Throws coc::Error(kInvalidArgument) with the file name and byte offset on unreadable,
/// truncated or non-trace input ("trace.json: byte 1234: unexpected end of input"); never returns a partial
/// result as complete.
std::vector<RankReport> analyze_file(const std::string& path, const AnalyzeOptions& opt);

/// Expands folders (*.json, *.json.gz, trace_view.json), analyses the files in parallel, refuses duplicate
/// ranks (edge case 26) and computes the cross-rank balance.
Report analyze_paths(const std::vector<std::string>& paths, const AnalyzeOptions& opt);

// Renderers (src/analysis/report_*.cpp).
std::string render_table(const Report& r, bool color);  ///< terminal table with verdicts
std::string render_json(const Report& r);
std::string render_csv(const Report& r);   ///< columns follow msprof-analyze's step_trace_time.csv
std::string render_svg(const Report& r);   ///< per-rank stacked bars + four-lane timeline
std::string render_html(const Report& r);  ///< self-contained page embedding the SVG and the table

}  // namespace coc::analysis
