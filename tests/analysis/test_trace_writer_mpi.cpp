// coc-test-np: 2
// The merged trace over real MPI ranks: clock offsets are measured (on one node every rank reads the same clock,
// so each offset lies within half its kept round trip of 0), every rank's records reach rank 0's single file,
// the file is written atomically (no temporary left), and every rank learns its path and its own totals. Also
// real collectives recorded through the progress engine carry op, bytes, seq, communicator, group_root and tag.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "coc/analysis/trace_writer.h"
#include "coc/comm/clock_sync.h"
#include "support/mpi_fixture.h"

namespace coc::analysis {
namespace {

using coc::test::world_comm;

TEST(TraceWriterMpi, ClockOffsetsOnOneNodeAreWithinTheirErrorBound) {
  auto world = world_comm();
  ClockOffsets c = measure_clock_offsets(*world, 16);
  ASSERT_EQ(c.offset_ns.size(), static_cast<size_t>(world->size()));
  EXPECT_EQ(c.offset_ns[0], 0);
  for (int r = 1; r < world->size(); ++r) {
    EXPECT_GT(c.rtt_ns[static_cast<size_t>(r)], 0);
    // Same CLOCK_MONOTONIC on one node: the true offset is 0 and the estimate is off by at most RTT/2.
    EXPECT_LE(std::llabs(c.offset_ns[static_cast<size_t>(r)]), c.rtt_ns[static_cast<size_t>(r)] / 2 + 1) << r;
  }
}

TEST(TraceWriterMpi, RecordsCollectivesAndMergesAllRanksIntoOneFile) {
  auto world = world_comm();
  const int me = world->rank(), P = world->size();
  ClockOffsets clocks = measure_clock_offsets(*world, 8);
  trace::clear();
  {
    trace::StepScope s(trace::Level::kLevel1, 5);
    std::vector<float> buf(1024, 1.0f);
    {
      COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "gemm", {"m", 8});
    }
    world->all_reduce(buf.data(), 1024, ReduceOp::kSum, "test chunk 1/2 [8, 128]").wait();
  }
  std::vector<trace::Record> records = trace::collect();
  ASSERT_EQ(records.size(), 3u);  // step, gemm, all_reduce
  // The directory: rank 0's fresh folder, shared by path (one node).
  std::string dir = "/tmp/coc_trace_writer_mpi_XXXXXX";
  if (me == 0) ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  world->broadcast_bytes(dir.data(), static_cast<int64_t>(dir.size()), 0, "dir").wait();
  TraceMeta meta;
  meta.clock_offsets_ns = clocks.offset_ns;
  meta.clock_rtt_ns = clocks.rtt_ns;
  meta.level = "level1";
  for (int r = 0; r < P; ++r) meta.ranks.push_back(r);
  MergedTraceResult res = write_merged_trace(*world, records, meta, dir);
  trace::clear();
  EXPECT_TRUE(res.profiled);
  EXPECT_EQ(res.steps, 1);
  EXPECT_EQ(res.events, 3u);
  EXPECT_EQ(res.overlap.computing + res.overlap.exposed + res.overlap.free, res.overlap.window);
  EXPECT_EQ(std::filesystem::path(res.path).parent_path().string(), dir);
  world->barrier("written");
  if (me == 0) {
    int files = 0;
    for (auto& f : std::filesystem::directory_iterator(dir)) {
      ++files;
      EXPECT_EQ(f.path().extension(), ".json") << f.path();  // no temporary left behind
    }
    EXPECT_EQ(files, 1);
    std::ifstream in(res.path);
    nlohmann::json doc = nlohmann::json::parse(in);
    EXPECT_EQ(doc["otherData"]["world_size"], P);
    std::set<int> ranks_seen, lanes_seen;
    int comm_events = 0;
    for (const auto& e : doc["traceEvents"]) {
      if (e["ph"] != "X") continue;
      const int pid = e["pid"];
      if (pid >= kOverlapPidBase) lanes_seen.insert(pid - kOverlapPidBase);
      else ranks_seen.insert(pid);
      if (e["cat"] == "comm") {
        ++comm_events;
        EXPECT_EQ(e["args"]["op"], "all_reduce");
        EXPECT_EQ(e["args"]["bytes"], 4096);
        EXPECT_EQ(e["args"]["comm"], "world");
        EXPECT_EQ(e["args"]["chunk"], "1/2");
        EXPECT_TRUE(e["args"]["seq"].is_number_integer());
        EXPECT_EQ(e["args"]["group_root"], 0);  // world's rank 0
      }
      if (e["cat"] == "step") EXPECT_EQ(e["name"], "ProfilerStep#5");
    }
    EXPECT_EQ(static_cast<int>(ranks_seen.size()), P);
    EXPECT_EQ(static_cast<int>(lanes_seen.size()), P);
    EXPECT_EQ(comm_events, P);
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace coc::analysis
