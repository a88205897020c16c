// One file: collect (trace_collect.cpp), build per format (trace_reader_*.cpp), resolve the rank (edge case 26 of
// docs/edge-cases.md), apply the convention's filter, compute the metrics (metrics_*.cpp).
#include <fmt/format.h>

#include <malloc.h>

#include <filesystem>
#include <regex>

#include "coc/core/error.h"
#include "json_scanner.h"
#include "metrics.h"
#include "trace_reader.h"

namespace coc::analysis {

namespace {

// "rank-3", "rank_3", "rank3", "worker3" in the file name (not the folders: a folder "rank_0" holding
// several ranks' files would lie).
int rank_from_file_name(const std::string& path) {
  static const std::regex re(R"((?:rank|worker)[-_]?(\d+))", std::regex::icase);
  const std::string base = std::filesystem::path(path).filename().string();
  std::smatch m;
  if (std::regex_search(base, m, re) && m[1].length() < 9) return std::stoi(m[1].str());
  return -1;
}

void resolve_rank(const detail::CollectedTrace& t, const std::string& path, const AnalyzeOptions& opt,
                  RankReport& r) {
  if (t.dist_rank >= 0) {
    r.rank = t.dist_rank;
    r.rank_source = "distributedInfo";
    return;
  }
  const std::string why = t.has_distributed_info ? "distributedInfo has no rank" : "no distributedInfo";
  auto it = opt.rank_of_file.find(path);
  if (it != opt.rank_of_file.end()) {
    r.rank = it->second;
    r.rank_source = "mapping";
    r.notes.push_back(fmt::format("{}: rank {} from the user's mapping", why, r.rank));
    return;
  }
  const int from_name = rank_from_file_name(path);
  if (from_name >= 0) {
    r.rank = from_name;
    r.rank_source = "file name";
    r.notes.push_back(fmt::format("{}: rank {} taken from the file name", why, r.rank));
    return;
  }
  r.rank = -1;
  r.rank_source = "none";
  r.notes.push_back(fmt::format("{}: rank unknown (give it with a rank mapping, e.g. FILE=RANK)", why));
}

}  // namespace

std::vector<RankReport> analyze_file(const std::string& path, const AnalyzeOptions& opt) {
  detail::CollectedTrace t;
  try {
    t = detail::collect_trace(path, opt.progress);
  } catch (const detail::ParseError& e) {
    if (e.io) throw Error(ErrorKind::kInvalidArgument, fmt::format("{}: {}", path, e.message), true);
    throw Error(ErrorKind::kInvalidArgument, fmt::format("{}: byte {}: {}", path, e.offset, e.message), true);
  }
  TraceFormat format = opt.format == TraceFormat::kAuto ? detail::detect_format(t) : opt.format;
  // HTA analyses device kernels only, and stops on a Kineto file without any: under its convention such a file
  // stays a Kineto trace with no device activity, as HTA sees it (the CPU analysis is coc's own).
  const bool hta_cpu_only = format == TraceFormat::kTorchCpu && opt.format == TraceFormat::kAuto &&
                            opt.convention == Convention::kHta && !t.top_level_array;
  if (hta_cpu_only) format = TraceFormat::kKineto;
  std::vector<detail::RankTrace> ranks = format == TraceFormat::kCoc      ? detail::build_coc(t, opt.convention)
                                         : format == TraceFormat::kAscend ? detail::build_ascend(t, opt.convention)
                                         : format == TraceFormat::kTorchCpu ? detail::build_torch_cpu(t, opt.convention)
                                                                          : detail::build_kineto(t, opt.convention);
  // The raw records are no longer needed: free them before the metrics allocate theirs (bounded peak memory).
  std::deque<detail::RawKept>().swap(t.events);
  std::deque<detail::RawKept>().swap(t.cpu_ops);
  ::malloc_trim(0);  // the deque's small blocks would otherwise stay mapped (glibc)
  if (ranks.empty()) {  // a coc trace without any rank process
    ranks.emplace_back();
    ranks.back().format = format;
  }
  std::vector<RankReport> out;
  for (detail::RankTrace& rt : ranks) {
    RankReport r;
    r.file = path;
    r.format = format;
    r.world_size = format == TraceFormat::kCoc ? t.world_size : 0;
    if (format == TraceFormat::kCoc && ranks.size() > 1) {
      r.rank = rt.rank;
      r.rank_source = "trace";
    } else if (format == TraceFormat::kCoc && rt.rank >= 0) {
      r.rank = rt.rank;
      r.rank_source = t.dist_rank >= 0 ? "distributedInfo" : "trace";
    } else {
      resolve_rank(t, path, opt, r);
    }
    if (opt.convention == Convention::kHta) r.hta_last_step_dropped = detail::apply_hta_step_filter(rt, t.names);
    if (r.hta_last_step_dropped) r.notes.push_back("HTA convention: the last ProfilerStep was dropped");
    r.events = t.total_events;
    r.malformed_events = t.malformed_events;
    r.zero_ts_events = t.zero_ts_events;
    if (t.malformed_events > 0)
      r.notes.push_back(fmt::format("{} malformed event(s) skipped or repaired", t.malformed_events));
    if (t.zero_ts_events > 0)
      r.notes.push_back(fmt::format("{} event(s) at ts 0 / dur 0 left out of the window", t.zero_ts_events));
    detail::fill_overlap(rt, t.names, opt, r);
    if (hta_cpu_only)
      r.notes.push_back("a CPU-only PyTorch trace: HTA's convention sees no device; --convention exact analyses the "
                        "CPU operators and gloo collectives (format torch-cpu)");
    detail::fill_hta_figures(rt, t.names, opt.convention, r);
    for (std::string& n : rt.notes) r.notes.push_back(std::move(n));
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace coc::analysis
