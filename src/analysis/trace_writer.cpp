// JSON text of coc's trace format (analysis/trace_writer.h; docs/profiling.md): one process per rank with named
// threads per track, "X" events with args, and the rank's "Overlap Analysis" process.
//
// Events are printed with fmt rather than built as an nlohmann::json tree: a level1 trace has ~10^4 events per
// step and rank, and the tree would cost ~10× the memory of the text. Strings that are not static identifiers
// (collective tags) are escaped with nlohmann::json's serializer.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <nlohmann/json.hpp>

#include "coc/analysis/trace_writer.h"

namespace coc::analysis {

namespace {

/// ns as µs with exactly three decimals ("12.345"): exact, and what Perfetto's importer reads as a double.
std::string us(int64_t ns) {
  if (ns < 0) return "-" + us(-ns);
  return fmt::format("{}.{:03}", ns / 1000, ns % 1000);
}

std::string json_str(std::string_view s) { return nlohmann::json(std::string(s)).dump(); }

void append_meta(std::string& out, int pid, int tid, const char* what, const std::string& value, bool sort = false) {
  if (!out.empty()) out += ",\n";
  if (sort)
    out += fmt::format(R"({{"ph":"M","name":"{}","pid":{},"tid":{},"args":{{"sort_index":{}}}}})", what, pid, tid,
                       value);
  else
    out += fmt::format(R"({{"ph":"M","name":"{}","pid":{},"tid":{},"args":{{"name":{}}}}})", what, pid, tid,
                       json_str(value));
}

/// "chunk 2/4" inside a CoC tag (detail::chunk_tag) → "2/4"; empty when absent.
std::string chunk_of(std::string_view tag) {
  const size_t p = tag.rfind("chunk ");
  if (p == std::string_view::npos) return {};
  size_t e = p + 6;
  while (e < tag.size() && (std::isdigit(static_cast<unsigned char>(tag[e])) || tag[e] == '/')) ++e;
  return e > p + 6 ? std::string(tag.substr(p + 6, e - p - 6)) : std::string();
}

std::string args_json(const trace::Record& r) {
  std::string a;
  auto add = [&](const std::string& kv) { a += (a.empty() ? "" : ",") + kv; };
  if (r.cat == trace::Cat::kComm) add(fmt::format(R"("op":"{}")", r.name));
  for (int i = 0; i < r.nargs; ++i) add(fmt::format(R"("{}":{})", r.args[i].key, r.args[i].value));
  // The stage's wait for a receive is traced outside any communicator; name the one its message travels in.
  if (r.cat == trace::Cat::kComm && std::strcmp(r.name, kPpRecvWaitEvent) == 0)
    add(fmt::format(R"("comm":"{}")", kPpGroup));
  else if (r.context)
    add(fmt::format(R"("{}":{})", r.cat == trace::Cat::kComm ? "comm" : "op", json_str(r.context)));
  if (r.label_key) {
    add(fmt::format(R"("{}":{})", r.label_key, json_str(r.label)));
    if (r.cat == trace::Cat::kComm)
      if (std::string c = chunk_of(r.label); !c.empty()) add(fmt::format(R"("chunk":"{}")", c));
  }
  return "{" + a + "}";
}

/// A collective of sharded data parallelism: posted on one of its communicators, named "fsdp ..." (fsdp.h).
bool is_fsdp_comm(const trace::Record& r) { return r.context && std::strncmp(r.context, "fsdp", 4) == 0; }

}  // namespace

bool is_pp_transfer(const trace::Record& r) {
  if (r.cat != trace::Cat::kComm) return false;
  if (r.context && std::strncmp(r.context, kPpLinkPrefix, std::strlen(kPpLinkPrefix)) == 0) return true;
  return std::strcmp(r.name, kPpRecvWaitEvent) == 0;
}

namespace {

std::string event_name(const trace::Record& r) {
  if (r.cat == trace::Cat::kStep)
    for (int i = 0; i < r.nargs; ++i)
      if (std::strcmp(r.args[i].key, "iteration") == 0) return fmt::format("ProfilerStep#{}", r.args[i].value);
  return r.name;
}

void append_x(std::string& out, const std::string& name, const char* cat, int pid, int tid, int64_t b, int64_t e,
              const std::string& args) {
  if (!out.empty()) out += ",\n";
  out += fmt::format(R"({{"ph":"X","cat":"{}","name":{},"pid":{},"tid":{},"ts":{},"dur":{},"args":{}}})", cat,
                     json_str(name), pid, tid, us(b), us(std::max<int64_t>(0, e - b)), args);
}

}  // namespace

std::string rank_events_json(const RankTrace& t, int64_t origin_ns, OverlapLanes* lanes_out) {
  std::string out;
  if (t.records.empty()) return out;
  const int pid = t.rank;
  const int64_t shift = t.clock_offset_ns + origin_ns;
  append_meta(out, pid, 0, "process_name", fmt::format("rank {}", t.rank));
  append_meta(out, pid, 0, "process_sort_index", std::to_string(2 * t.rank), true);
  append_meta(out, pid, 0, "process_labels", fmt::format("coc rank {}", t.rank));

  // Perfetto wants the slices of one track strictly nested; collectives of a CoC op overlap each other (chunk i+1
  // is posted before chunk i completes), so they are spread greedily over as many comm tracks as needed.
  std::vector<size_t> order(t.records.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto &x = t.records[a], &y = t.records[b];
    return x.begin_ns != y.begin_ns ? x.begin_ns < y.begin_ns : x.end_ns > y.end_ns;
  });
  // Sharded data parallelism's collectives (on its "fsdp ..." communicators) get tracks of their own, after the
  // other comm tracks: they overlap whole modules, not a GEMM's chunks. So do the pipeline's stage transfers
  // (is_pp_transfer), on "comm pp": a bubble is then seen at a glance as a long slice there.
  std::vector<int64_t> comm_lane_end, fsdp_lane_end, pp_lane_end;
  auto lane_of = [](std::vector<int64_t>& ends, const trace::Record& r) {
    size_t lane = 0;
    while (lane < ends.size() && ends[lane] > r.begin_ns) ++lane;
    if (lane == ends.size()) ends.push_back(0);
    ends[lane] = std::max(r.end_ns, r.begin_ns);
    return static_cast<int>(lane);
  };
  bool used[3] = {false, false, false};
  for (size_t i : order) {
    const trace::Record& r = t.records[i];
    int tid = static_cast<int>(r.track);
    if (r.track == trace::Track::kCounter) {
      if (!out.empty()) out += ",\n";
      out += fmt::format(R"({{"ph":"C","name":{},"pid":{},"tid":0,"ts":{},"args":{}}})", json_str(r.name), pid,
                         us(r.begin_ns - shift), args_json(r));
      continue;
    }
    if (r.track == trace::Track::kComm && is_pp_transfer(r)) {
      tid = kPpTid + lane_of(pp_lane_end, r);
    } else if (r.track == trace::Track::kComm && is_fsdp_comm(r)) {
      tid = kFsdpTid + lane_of(fsdp_lane_end, r);
    } else if (r.track == trace::Track::kComm) {
      tid = kCommTid + lane_of(comm_lane_end, r);
    } else {
      used[tid] = true;
    }
    append_x(out, event_name(r), trace::to_string(r.cat), pid, tid, r.begin_ns - shift, r.end_ns - shift,
             args_json(r));
  }
  if (used[0]) append_meta(out, pid, 0, "thread_name", "host");
  if (used[1]) append_meta(out, pid, 1, "thread_name", "compute");
  for (size_t lane = 0; lane < comm_lane_end.size(); ++lane)
    append_meta(out, pid, kCommTid + static_cast<int>(lane), "thread_name",
                lane == 0 ? std::string("comm") : fmt::format("comm (concurrent #{})", lane + 1));
  for (int tid = 0; tid < kCommTid + static_cast<int>(comm_lane_end.size()); ++tid)
    append_meta(out, pid, tid, "thread_sort_index", std::to_string(tid), true);
  auto name_lanes = [&](const std::vector<int64_t>& ends, int first_tid, const char* name) {
    for (size_t lane = 0; lane < ends.size(); ++lane) {
      const int tid = first_tid + static_cast<int>(lane);
      append_meta(out, pid, tid, "thread_name",
                  lane == 0 ? std::string(name) : fmt::format("{} (concurrent #{})", name, lane + 1));
      append_meta(out, pid, tid, "thread_sort_index", std::to_string(tid), true);
    }
  };
  name_lanes(fsdp_lane_end, kFsdpTid, "comm fsdp");
  name_lanes(pp_lane_end, kPpTid, "comm pp");

  // The Overlap Analysis process, drawn under the rank (Ascend's layout).
  OverlapLanes lanes = overlap_lanes(t.records, shift);
  const int opid = kOverlapPidBase + t.rank;
  append_meta(out, opid, 0, "process_name", fmt::format("Overlap Analysis (rank {})", t.rank));
  append_meta(out, opid, 0, "process_sort_index", std::to_string(2 * t.rank + 1), true);
  static const char* kLane[4] = {"Computing", "Communication", "Communication(Not Overlapped)", "Free"};
  const IntervalSet* sets[4] = {&lanes.computing, &lanes.communication, &lanes.exposed, &lanes.free};
  for (int l = 0; l < 4; ++l) {
    append_meta(out, opid, l, "thread_name", kLane[l]);
    append_meta(out, opid, l, "thread_sort_index", std::to_string(l), true);
    for (const Interval& iv : sets[l]->parts())
      append_x(out, kLane[l], "overlap_analysis", opid, l, iv.begin, iv.end, "{}");
  }
  if (lanes_out) *lanes_out = std::move(lanes);
  return out;
}

std::string trace_document(const TraceMeta& meta, const std::vector<std::string>& fragments) {
  nlohmann::json other = {{"producer", "coc"},
                          {"coc_version", COC_VERSION},
                          {"world_size", meta.world_size},
                          {"ranks", meta.ranks},
                          {"clock_offsets_ns", meta.clock_offsets_ns},
                          {"clock_rtt_ns", meta.clock_rtt_ns},
                          {"profile_level", meta.level},
                          {"profile_step_start", meta.step_start},
                          {"profile_step_end", meta.step_end},
                          {"dropped_events", meta.dropped_events},
                          {"overlap_pid_base", kOverlapPidBase},
                          {"pipeline_model_parallel_size", meta.pipeline_stages}};
  if (meta.micro_batches > 0) other["num_microbatches"] = meta.micro_batches;
  if (meta.virtual_stages > 1) other["num_virtual_stages_per_pipeline_rank"] = meta.virtual_stages;
  size_t bytes = 256;
  for (const auto& f : fragments) bytes += f.size() + 2;
  std::string out;
  out.reserve(bytes);
  out += "{\"traceEvents\":[\n";
  bool first = true;
  for (const auto& f : fragments) {
    if (f.empty()) continue;
    if (!first) out += ",\n";
    out += f;
    first = false;
  }
  out += "\n],\n\"displayTimeUnit\":\"ns\",\n\"otherData\":";
  out += other.dump();
  out += "}\n";
  return out;
}

}  // namespace coc::analysis
