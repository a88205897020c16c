// What the readers keep of a trace (internal to src/analysis/): only device events, host calls that carry a
// correlation id, step markers and metadata, in compact records with interned names, so memory is bounded by
// the number of device events and launches, not by the file size (edge case 31 of docs/edge-cases.md).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "coc/analysis/analyze.h"

namespace coc::analysis::detail {

/// Interned strings: one copy per distinct name or category. Ids are dense from 0.
class NameTable {
 public:
  uint32_t intern(std::string_view s);
  const std::string& operator[](uint32_t id) const { return names_[id]; }
  size_t size() const { return names_.size(); }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, uint32_t, Hash, std::equal_to<>> ids_;
  std::vector<std::string> names_;
};

/// What an event on a device counts as (event_classify.h has the rules).
enum class Kind : uint8_t { kCompute, kComm, kMemory, kSync, kOther };
const char* kind_name(Kind k);

/// One complete ('X') event kept by the generic collector, before the format-specific builder assigns it a role.
/// Times in exact ns on the trace's clock; hta_* are HTA's inward-rounded µs (ceil(ts), floor(ts + dur) in
/// double arithmetic, trace_parser.py) stored as deltas to floor(ns / 1000) so the record stays small.
struct RawKept {
  int64_t ts = 0, end = 0;
  int64_t stream = -1;       ///< args.stream when it is an integer; -1 otherwise (HTA coerces "0x0" to -1)
  int64_t corr = -1;         ///< args.correlation; -1 when absent
  uint32_t thread = 0;       ///< index of the event's (pid, tid) in CollectedTrace::threads (8 bytes, not 16, a record)
  uint32_t name = 0, cat = 0;
  uint32_t extra = 0;        ///< interned args["Task Type"] (Ascend), the op of a coc collective's args.tag
                             ///< (comm_op_name, event_classify.h), or 0
  uint32_t group = 0;        ///< interned communicator of a collective (args comm, or Kineto's process group) or 0
  int64_t collective = -1;   ///< coc collectives: collective_key(args group_root, args seq), the same on every rank
                             ///< of the group; -1 when either is absent (older coc traces, other formats)
  int8_t hta_begin_adj = 0, hta_end_adj = 0;
  bool has_stream = false;   ///< args.stream was an integer
};

/// One collective of a communicator's group instance: its rank 0 (as a world rank, < 2^23) and its sequence number
/// (< 2^40) in one integer; -1 when out of range.
inline int64_t collective_key(int64_t group_root, int64_t seq) {
  if (group_root < 0 || group_root >= (int64_t{1} << 23) || seq < 0 || seq >= (int64_t{1} << 40)) return -1;
  return group_root << 40 | seq;
}

inline int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

/// Everything the collector kept from one file.
struct CollectedTrace {
  NameTable names;
  /// Distinct (pid, tid) pairs, indexed by RawKept::thread. Traces have a handful of threads and millions of
  /// events, so the pair is stored once (64-bit pids and string tids, edge case 29, stay exact).
  std::vector<std::pair<int64_t, int64_t>> threads;
  std::unordered_map<uint64_t, std::vector<uint32_t>> thread_index;  ///< thread_key -> candidates in `threads`
  uint32_t thread_id(int64_t pid, int64_t tid);
  int64_t pid_of(const RawKept& e) const { return threads[e.thread].first; }
  int64_t tid_of(const RawKept& e) const { return threads[e.thread].second; }
  std::deque<RawKept> events;  ///< a deque: no 2x slack while growing, memory stays proportional
  /// Kineto objects: CPU operators and annotations (cat cpu_op / user_annotation, neither a stream nor a
  /// correlation id), kept for build_torch_cpu only while the file has shown no device: a non-empty
  /// "deviceProperties" (before traceEvents in Kineto's files) or the first device event clears them and stops the
  /// keeping, so a GPU trace's memory stays bounded by its device events.
  std::deque<RawKept> cpu_ops;
  bool seen_device = false;  ///< deviceProperties listed a device, or a device event was read
  std::unordered_map<int64_t, uint32_t> process_names;                 ///< pid -> interned name
  std::unordered_map<uint64_t, uint32_t> thread_names;                 ///< hash(pid, tid) -> interned name
  bool top_level_array = false;
  bool has_trace_events = false;
  bool coc_producer = false;          ///< otherData.producer == "coc"
  bool has_distributed_info = false;
  int dist_rank = -1;                 ///< distributedInfo.rank, -1 when absent
  int64_t pp_stages = 0;              ///< coc: otherData.pipeline_model_parallel_size (P), 0 when absent
  int64_t pp_micro_batches = 0;       ///< coc: otherData.num_microbatches (M), 0 when absent
  int64_t pp_virtual_stages = 0;      ///< coc: otherData.num_virtual_stages_per_pipeline_rank (V), 0 when absent
  int64_t world_size = 0;             ///< coc: otherData.world_size, 0 when absent
  int64_t total_events = 0;
  int64_t malformed_events = 0;
  int64_t zero_ts_events = 0;
  uint64_t bytes = 0;
};

inline uint64_t thread_key(int64_t pid, int64_t tid) {
  return static_cast<uint64_t>(pid) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(tid);
}

inline uint32_t CollectedTrace::thread_id(int64_t pid, int64_t tid) {
  std::vector<uint32_t>& ids = thread_index[thread_key(pid, tid)];
  for (uint32_t id : ids)
    if (threads[id].first == pid && threads[id].second == tid) return id;
  ids.push_back(static_cast<uint32_t>(threads.size()));
  threads.emplace_back(pid, tid);
  return ids.back();
}

/// One device event after classification.
struct DeviceEvent {
  int64_t ts = 0, end = 0;   ///< ns under the chosen convention (HTA: whole µs × 1000)
  int64_t corr = -1;
  int64_t stream = 0;
  uint32_t name = 0;
  Kind kind = Kind::kOther;
  uint32_t group = 0;  ///< interned communicator (process group) of a collective; 0 when the trace names none
  uint32_t op = 0;     ///< coc: interned operation of a collective (comm_op_name of its args.tag); 0 when untagged
  int64_t collective = -1;  ///< coc: RawKept::collective
};

/// A host call that may have launched a device event (same correlation id).
struct HostCall {
  int64_t ts = 0, end = 0;
  int64_t corr = -1;
  uint32_t name = 0;
};

/// A ProfilerStep / coc iteration window.
struct StepMarker {
  int64_t ts = 0, end = 0;
  uint32_t name = 0;
  bool on_device = false;  ///< gpu_user_annotation copy of the step (HTA counts it among "CPU" rows)
};

/// One rank's events, ready for the metrics (metrics_*.cpp).
struct RankTrace {
  int rank = -1;
  TraceFormat format = TraceFormat::kAuto;
  std::vector<DeviceEvent> device;
  std::vector<HostCall> host;
  std::vector<StepMarker> steps;
  struct HostWork {
    int64_t ts = 0, end = 0;
    uint32_t name = 0;
  };
  std::vector<HostWork> host_work;  ///< coc traces: cat "host_work" events (neither compute nor communication)
  std::vector<Interval> auto_timing;  ///< coc traces: --coc-parallel-num auto's timings (host "coc_auto_timing")
  int64_t pp_stages = 0, pp_micro_batches = 0;  ///< coc traces: P and M of the run's metadata (0: absent)
  int64_t pp_virtual_stages = 0;                ///< coc traces: V of the run's metadata (0: absent, i.e. 1)
  bool has_vendor_lanes = false;
  std::vector<Interval> vendor_lanes[4];  ///< Computing, Communication, Communication(Not Overlapped), Free
  std::vector<std::string> notes;
};

}  // namespace coc::analysis::detail
