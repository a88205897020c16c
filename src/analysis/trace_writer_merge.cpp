// Gathering every rank's trace fragment to rank 0 and writing the merged file atomically
// (analysis/trace_writer.h). One file for the whole job, like Kineto's per-worker files merged by HTA or
// msprof's cluster view, but produced by the job itself: Perfetto then shows all ranks on one timeline.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "coc/analysis/trace_writer.h"
#include "coc/core/error.h"
#include "coc/core/log.h"

namespace coc::analysis {

namespace {
std::string utc_stamp() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}
}  // namespace

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  auto fail = [&](const char* what, int err) {
    std::remove(tmp.c_str());
    throw_error(ErrorKind::kIo, "rank {}: cannot write the trace {}: {} ({}); check --profile-dir's space and "
                "permissions", log::rank(), path, what, std::strerror(err));
  };
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot create the temporary file", errno);
  if (std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fflush(f) != 0) {
    int err = errno;
    std::fclose(f);
    fail("short write", err);
  }
  if (::fsync(::fileno(f)) != 0) {
    int err = errno;
    std::fclose(f);
    fail("cannot sync", err);
  }
  if (std::fclose(f) != 0) fail("cannot close", errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename into place", errno);
}

MergedTraceResult write_merged_trace(Communicator& world, std::vector<trace::Record> records, const TraceMeta& meta,
                                     const std::string& dir) {
  const int P = world.size(), me = world.rank();
  MergedTraceResult res;
  res.profiled = !records.empty();
  res.events = records.size();
  const int64_t offset =
      static_cast<size_t>(me) < meta.clock_offsets_ns.size() ? meta.clock_offsets_ns[static_cast<size_t>(me)] : 0;

  // The origin: the earliest event of any rank, on rank 0's clock.
  int64_t origin = INT64_MAX;
  for (const auto& r : records) origin = std::min(origin, r.begin_ns - offset);
  origin = world.all_reduce_value(origin, ReduceOp::kMin, "trace origin");
  const uint64_t dropped = world.all_reduce_value(meta.dropped_events, ReduceOp::kSum, "trace dropped events");

  RankTrace mine{me, offset, std::move(records)};
  OverlapLanes lanes;
  const std::string frag = rank_events_json(mine, origin, &lanes);
  res.overlap = lanes.total;
  res.steady = lanes.steady;
  for (const OverlapLanes::Step& s : lanes.steps)
    if (s.auto_timing) res.auto_timing_steps.push_back(s.name);
  res.host_work_free = lanes.host_work_free;
  res.steps = static_cast<int>(std::count_if(lanes.steps.begin(), lanes.steps.end(),
                                             [](const OverlapLanes::Step& s) { return s.name != "whole trace"; }));
  if (frag.size() > static_cast<size_t>(INT_MAX))
    throw_error(ErrorKind::kInvalidArgument, "rank {}: the trace of this rank is {} bytes, over MPI's 2 GiB message "
                "limit; profile fewer steps (--profile-step-start/--profile-step-end) or use --profile-level level0",
                me, frag.size());
  std::vector<std::string> frags;
  try {
    frags = world.gather_bytes(frag, 0, "trace fragments");
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kInvalidArgument) throw;  // a count over MPI's int: on rank 0, the total
    throw_error(ErrorKind::kInvalidArgument, "rank 0: the merged trace exceeds 2 GiB; profile fewer steps "
                "(--profile-step-start/--profile-step-end), fewer ranks (--profile-ranks) or level0");
  }

  std::string path;
  if (me == 0) {
    TraceMeta m = meta;
    m.world_size = P;
    m.dropped_events = dropped;
    path = (std::filesystem::path(dir) / fmt::format("coc_trace_{}.json", utc_stamp())).string();
    write_file_atomically(path, trace_document(m, frags));
  }
  // Every rank learns the path (for its own log line and the caller's result).
  res.path = world.broadcast_string(std::move(path), 0, "trace path");
  return res;
}

}  // namespace coc::analysis
