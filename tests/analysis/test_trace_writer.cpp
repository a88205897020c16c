// The trace writer (coc/analysis/trace_writer.h) on synthetic records: the Overlap Analysis lanes sum to the step
// windows and match an independent recomputation; ranks merge into one document with aligned clocks, named
// processes and threads; overlapping collectives go to separate, properly nested tracks; ts/dur keep exact ns.
// Single process.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "coc/analysis/trace_writer.h"

namespace coc::analysis {
namespace {

using trace::Cat;
using trace::Record;

Record rec(Cat cat, const char* name, int64_t b, int64_t e) {
  Record r;
  r.cat = cat;
  r.track = cat == Cat::kCompute ? trace::Track::kCompute
            : cat == Cat::kComm  ? trace::Track::kComm
                                 : trace::Track::kHost;
  r.name = name;
  r.begin_ns = b;
  r.end_ns = e;
  return r;
}
Record step(int64_t it, int64_t b, int64_t e) {
  Record r = rec(Cat::kStep, "ProfilerStep", b, e);
  r.add("iteration", it);
  return r;
}

/// Two steps: step 3 [1000, 2000) and step 4 [2000, 3500), with GEMMs and overlapping collectives.
std::vector<Record> sample(int64_t shift) {
  std::vector<Record> v = {step(3, 1000, 2000), step(4, 2000, 3500),
                           rec(Cat::kHost, "forward", 1000, 1900),
                           rec(Cat::kCompute, "gemm", 1100, 1400), rec(Cat::kCompute, "gemm", 1400, 1600),
                           rec(Cat::kComm, "all_reduce", 1300, 1700), rec(Cat::kComm, "all_reduce", 1500, 1800),
                           rec(Cat::kCompute, "gemm", 1950, 2600),  // crosses the step boundary: split by the windows
                           rec(Cat::kComm, "reduce_scatter", 2500, 3000), rec(Cat::kCompute, "gemm", 3400, 3600)};
  v[3].context = "matmul_all_reduce";
  v[5].add("bytes", 4096);
  v[5].set_label("tag", "layers.0.mlp.down fwd chunk 2/4 [128, 192]");
  for (auto& r : v) {
    r.begin_ns += shift;
    r.end_ns += shift;
  }
  return v;
}

TEST(TraceWriter, LanesSumToTheWindowsAndMatchTheDefinition) {
  OverlapLanes l = overlap_lanes(sample(0), 0);
  ASSERT_EQ(l.steps.size(), 2u);
  EXPECT_EQ(l.steps[0].name, "ProfilerStep#3");
  EXPECT_EQ(l.steps[1].name, "ProfilerStep#4");
  for (const auto& s : l.steps)
    EXPECT_EQ(s.split.computing + s.split.exposed + s.split.free, s.split.window) << s.name;
  // By hand: C = [1100,1600) ∪ [1950,2600) ∪ [3400,3600); M = [1300,1800) ∪ [2500,3000).
  // Step 3 [1000,2000): C 500+50 = 550, M 500, C∩M 300, exposed 200, free 1000-750 = 250.
  EXPECT_EQ(l.steps[0].split.computing, 550);
  EXPECT_EQ(l.steps[0].split.communication, 500);
  EXPECT_EQ(l.steps[0].split.overlapped, 300);
  EXPECT_EQ(l.steps[0].split.exposed, 200);
  EXPECT_EQ(l.steps[0].split.free, 250);
  // Step 4 [2000,3500): C 600+100 = 700, M 500, C∩M 100, exposed 400, free 1500-1100 = 400.
  EXPECT_EQ(l.steps[1].split.computing, 700);
  EXPECT_EQ(l.steps[1].split.exposed, 400);
  EXPECT_EQ(l.steps[1].split.free, 400);
  EXPECT_EQ(l.total.window, 2500);
  EXPECT_EQ(l.computing.measure(), l.total.computing);
  EXPECT_EQ(l.communication.measure(), l.total.communication);
  EXPECT_EQ(l.exposed.measure(), l.total.exposed);
  EXPECT_EQ(l.free.measure(), l.total.free);
}

TEST(TraceWriter, StepsWhereAutoTimedItsCandidatesAreLeftOutOfTheSteadyTotals) {
  std::vector<Record> v = sample(0);
  OverlapLanes plain = overlap_lanes(v, 0);
  EXPECT_FALSE(plain.steps[0].auto_timing);
  EXPECT_EQ(plain.steady.window, plain.total.window);  // nothing timed: steady == total
  // A choice taken without timing (a cache hit, a rule) does not mark its step.
  v.push_back(rec(Cat::kHost, trace::kAutoChoiceEvent, 2100, 2150));
  // A timing beginning in step 3 marks step 3, even though it ends in step 4.
  v.push_back(rec(Cat::kHost, trace::kAutoChoiceEvent, 1190, 2210));
  v.push_back(rec(Cat::kHost, trace::kAutoTimingEvent, 1200, 2200));
  OverlapLanes l = overlap_lanes(v, 0);
  ASSERT_EQ(l.steps.size(), 2u);
  EXPECT_TRUE(l.steps[0].auto_timing);
  EXPECT_FALSE(l.steps[1].auto_timing);
  // Host events delimit nothing: the lanes and the totals are those without the auto events.
  EXPECT_EQ(l.total.exposed, plain.total.exposed);
  EXPECT_EQ(l.total.window, 2500);
  EXPECT_EQ(l.steady.window, 1500);  // step 4 only
  EXPECT_EQ(l.steady.computing, l.steps[1].split.computing);
  EXPECT_EQ(l.steady.exposed, l.steps[1].split.exposed);
  EXPECT_EQ(l.steady.free, l.steps[1].split.free);
  // A timing that begins exactly where step 4 begins belongs to step 4 (windows are [begin, end)).
  std::vector<Record> w = sample(0);
  w.push_back(rec(Cat::kHost, trace::kAutoTimingEvent, 2000, 2100));
  OverlapLanes b = overlap_lanes(w, 0);
  EXPECT_FALSE(b.steps[0].auto_timing);
  EXPECT_TRUE(b.steps[1].auto_timing);
  EXPECT_EQ(b.steady.window, 1000);
}

TEST(TraceWriter, NoStepsMeansOneWholeTraceWindow) {
  std::vector<Record> v = {rec(Cat::kCompute, "gemm", 0, 10), rec(Cat::kComm, "all_reduce", 20, 30)};
  OverlapLanes l = overlap_lanes(v, 0);
  ASSERT_EQ(l.steps.size(), 1u);
  EXPECT_EQ(l.steps[0].name, "whole trace");
  EXPECT_EQ(l.total.window, 30);
  EXPECT_EQ(l.total.free, 10);
  EXPECT_TRUE(overlap_lanes({}, 0).steps.empty());
}

/// ns from a "µs with 3 decimals" JSON number, as a reader recovers them.
int64_t ns_of(const nlohmann::json& v) { return std::llround(v.get<double>() * 1000.0); }

TEST(TraceWriter, MergedDocumentHasAlignedRanksNamedTracksAndLanes) {
  // Rank 1's clock runs 1'000'000 ns ahead of rank 0's: after alignment its events coincide with rank 0's.
  RankTrace r0{0, 0, sample(0)}, r1{1, 1000000, sample(1000000)};
  OverlapLanes l0, l1;
  const int64_t origin = 1000;  // the earliest aligned event
  std::vector<std::string> frags = {rank_events_json(r0, origin, &l0), rank_events_json(r1, origin, &l1)};
  TraceMeta meta;
  meta.world_size = 2;
  meta.ranks = {0, 1};
  meta.clock_offsets_ns = {0, 1000000};
  meta.clock_rtt_ns = {0, 5000};
  meta.level = "level1";
  const std::string text = trace_document(meta, frags);
  nlohmann::json doc = nlohmann::json::parse(text);  // throws on malformed JSON
  EXPECT_EQ(doc["displayTimeUnit"], "ns");
  EXPECT_EQ(doc["otherData"]["producer"], "coc");
  EXPECT_EQ(doc["otherData"]["clock_offsets_ns"][1], 1000000);

  std::map<std::pair<int, int>, std::string> thread_names;
  std::map<int, std::string> process_names;
  std::map<int, std::map<std::string, int64_t>> lane_sum;  // rank → lane → ns
  std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>> by_track;
  int64_t min_ts = INT64_MAX;
  for (const auto& e : doc["traceEvents"]) {
    ASSERT_TRUE(e["ph"].is_string());
    ASSERT_TRUE(e["pid"].is_number_integer());
    ASSERT_TRUE(e["tid"].is_number_integer());
    const int pid = e["pid"], tid = e["tid"];
    if (e["ph"] == "M") {
      if (e["name"] == "process_name") process_names[pid] = e["args"]["name"];
      if (e["name"] == "thread_name") thread_names[{pid, tid}] = e["args"]["name"];
      continue;
    }
    ASSERT_EQ(e["ph"], "X");
    ASSERT_TRUE(e["ts"].is_number() && e["dur"].is_number());
    ASSERT_GE(e["dur"].get<double>(), 0.0);
    const int64_t b = ns_of(e["ts"]), d = ns_of(e["dur"]);
    min_ts = std::min(min_ts, b);
    if (e["cat"] == "overlap_analysis") {
      lane_sum[pid - kOverlapPidBase][e["name"]] += d;
    } else {
      by_track[{pid, tid}].push_back({b, b + d});
    }
    if (e["cat"] == "comm" && e["args"].contains("tag")) {
      EXPECT_EQ(e["args"]["chunk"], "2/4");
      EXPECT_EQ(e["args"]["bytes"], 4096);
      EXPECT_EQ(e["args"]["op"], "all_reduce");
    }
    if (e["cat"] == "compute" && e["args"].contains("op")) EXPECT_EQ(e["args"]["op"], "matmul_all_reduce");
    if (e["cat"] == "step") EXPECT_EQ(e["name"].get<std::string>().rfind("ProfilerStep#", 0), 0u);
  }
  EXPECT_EQ(min_ts, 0);  // relative to the origin
  EXPECT_EQ(process_names[0], "rank 0");
  EXPECT_EQ(process_names[1], "rank 1");
  EXPECT_EQ(process_names[kOverlapPidBase + 1], "Overlap Analysis (rank 1)");
  EXPECT_EQ((thread_names[{0, 0}]), "host");
  EXPECT_EQ((thread_names[{0, 1}]), "compute");
  EXPECT_EQ((thread_names[{0, kCommTid}]), "comm");
  EXPECT_EQ((thread_names[{kOverlapPidBase, 2}]), "Communication(Not Overlapped)");
  // The two overlapping all-reduces cannot share a track.
  EXPECT_EQ(thread_names.count({0, kCommTid + 1}), 1u);
  // Perfetto's rule: within a track, slices nest or are disjoint.
  for (auto& [track, v] : by_track) {
    std::sort(v.begin(), v.end(),
              [](auto& a, auto& b) { return a.first != b.first ? a.first < b.first : a.second > b.second; });
    std::vector<int64_t> open;
    for (auto [b, e] : v) {
      while (!open.empty() && open.back() <= b) open.pop_back();
      if (!open.empty())
        ASSERT_LE(e, open.back()) << "misnested slice on pid " << track.first << " tid " << track.second;
      open.push_back(e);
    }
  }
  // Aligned: both ranks' tracks coincide, and the lanes read back equal the writer's totals.
  EXPECT_EQ((by_track[{0, 1}]), (by_track[{1, 1}]));
  for (int r : {0, 1}) {
    const OverlapLanes& l = r == 0 ? l0 : l1;
    EXPECT_EQ(lane_sum[r]["Computing"], l.total.computing);
    EXPECT_EQ(lane_sum[r]["Communication"], l.total.communication);
    EXPECT_EQ(lane_sum[r]["Communication(Not Overlapped)"], l.total.exposed);
    EXPECT_EQ(lane_sum[r]["Free"], l.total.free);
    EXPECT_EQ(lane_sum[r]["Computing"] + lane_sum[r]["Communication(Not Overlapped)"] + lane_sum[r]["Free"],
              l.total.window);
  }
}

TEST(TraceWriter, TimestampsKeepExactNanoseconds) {
  RankTrace t{0, 0, {rec(Cat::kCompute, "gemm", 1234567891, 1234567891 + 999)}};
  std::string frag = rank_events_json(t, 1000000000, nullptr);
  EXPECT_NE(frag.find("\"ts\":234567.891,\"dur\":0.999"), std::string::npos) << frag;
}

TEST(TraceWriter, EmptyRanksContributeNothing) {
  EXPECT_TRUE(rank_events_json(RankTrace{3, 0, {}}, 0, nullptr).empty());
  nlohmann::json doc = nlohmann::json::parse(trace_document(TraceMeta{}, {"", ""}));
  EXPECT_TRUE(doc["traceEvents"].empty());
}

}  // namespace
}  // namespace coc::analysis
