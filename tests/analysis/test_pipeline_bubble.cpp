// Pipeline parallelism in the trace and in `coc analyze` (docs/analysis.md, "Pipeline bubble"; docs/pipeline.md): a
// synthetic two-stage 1F1B step (P = 2, M = 2) written by the trace writer, then analysed. The stage transfers go
// on a "comm pp" track of their own, the links and waits count as the communicator row "pp", and the bubble (the
// stage waiting for a pp receive with nothing computing) is exact per rank, next to the ideal (P − 1)/(M + P − 1).
// Single process.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coc/analysis/analyze.h"
#include "coc/analysis/trace_writer.h"
#include "support/temp_dir.h"
#include "trace_test_util.h"

namespace coc::analysis {
namespace {

using trace::Cat;
using trace::Record;

constexpr int64_t kUs = 1000;  // the events below are in µs

Record rec(Cat cat, const char* name, int64_t b_us, int64_t e_us, const char* comm = nullptr) {
  Record r;
  r.cat = cat;
  r.track = cat == Cat::kCompute ? trace::Track::kCompute : cat == Cat::kComm ? trace::Track::kComm : trace::Track::kHost;
  r.name = name;
  r.context = comm;
  r.begin_ns = b_us * kUs;
  r.end_ns = e_us * kUs;
  return r;
}
Record compute(int64_t b, int64_t e) { return rec(Cat::kCompute, "gemm", b, e); }
Record link(const char* comm, int64_t b, int64_t e) { return rec(Cat::kComm, "exchange", b, e, comm); }
Record wait(int64_t b, int64_t e) { return rec(Cat::kComm, "pp_recv_wait", b, e); }

// One step [0, 100) µs per stage.
// Stage 0: F0 [0, 10), F1 [10, 20), B0 [40, 60), B1 [70, 90) compute; sends A0 [10, 12) (under F1: hidden) and A1
//   [20, 22) on pp-link-act; waits for G0 [20, 40) and G1 [55, 70) (the latter overlapping B0's last 5 µs, to check
//   that compute is taken out), with their receives on pp-link-grad; a dp all-reduce [90, 95).
//   Bubble = [20, 40) + ([55, 70) \ B0) = 20 + 10 = 30 µs. pp row: [10, 12) ∪ [20, 40) ∪ [55, 70) = 37 µs, exposed
//   30 µs. Exposed in all: 30 + dp's 5 = 35 µs.
// Stage 1: waits for A0 [0, 10) and A1 [40, 50) (its receive posted at 38, under B0); F0 [10, 20), B0 [20, 40),
//   F1 [50, 60), B1 [60, 80); sends G0 [40, 42) and G1 [80, 82) on pp-link-grad; a dp all-reduce [82, 95).
//   Bubble = 10 + 10 = 20 µs. pp row: [0, 10) ∪ [38, 50) ∪ [80, 82) = 24 µs, exposed 22 µs.
std::vector<Record> stage(int s) {
  Record st = rec(Cat::kStep, "ProfilerStep", 0, 100);
  st.add("iteration", 5);
  Record dp0 = rec(Cat::kComm, "all_reduce", 90, 95, "dp"), dp1 = rec(Cat::kComm, "all_reduce", 82, 95, "dp");
  if (s == 0)
    return {st, compute(0, 10), compute(10, 20), compute(40, 60), compute(70, 90), link("pp-link-act", 10, 12),
            link("pp-link-act", 20, 22), wait(20, 40), link("pp-link-grad", 20, 40), wait(55, 70),
            link("pp-link-grad", 60, 70), dp0};
  return {st, wait(0, 10), link("pp-link-act", 0, 10), compute(10, 20), compute(20, 40), link("pp-link-act", 38, 50),
          wait(40, 50), link("pp-link-grad", 40, 42), compute(50, 60), compute(60, 80), link("pp-link-grad", 80, 82),
          dp1};
}

std::string two_stage_trace(int virtual_stages = 1) {
  TraceMeta meta;
  meta.world_size = 2;
  meta.ranks = {0, 1};
  meta.clock_offsets_ns = {0, 0};
  meta.clock_rtt_ns = {0, 0};
  meta.level = "level0";
  meta.pipeline_stages = 2;
  meta.micro_batches = 2;
  meta.virtual_stages = virtual_stages;
  std::vector<std::string> fragments;
  for (int r = 0; r < 2; ++r) fragments.push_back(rank_events_json({r, 0, stage(r)}, 0));
  return trace_document(meta, fragments);
}

const CommGroupStat* row(const RankReport& rk, const std::string& name) {
  for (const CommGroupStat& g : rk.comm_groups)
    if (g.name == name) return &g;
  return nullptr;
}

TEST(PipelineTrace, StageTransfersGoOnACommPpTrackAndTheMetadataCarriesPAndM) {
  const nlohmann::json doc = nlohmann::json::parse(two_stage_trace());
  EXPECT_EQ(doc["otherData"]["pipeline_model_parallel_size"], 2);
  EXPECT_EQ(doc["otherData"]["num_microbatches"], 2);
  std::map<std::pair<int, int>, std::string> thread_names;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name") thread_names[{e["pid"], e["tid"]}] = e["args"]["name"];
  int pp_events = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "X" || e["cat"] != "comm") continue;
    const bool pp = e["name"] == "pp_recv_wait" || e["args"].value("comm", "").rfind("pp-link", 0) == 0;
    const int tid = e["tid"];
    if (pp) {
      ++pp_events;
      EXPECT_GE(tid, kPpTid) << e.dump();
      const std::string track = thread_names[std::pair<int, int>(e["pid"], tid)];
      EXPECT_EQ(track.rfind("comm pp", 0), 0u) << e.dump();
    } else {
      EXPECT_LT(tid, kFsdpTid) << e.dump();  // the dp all-reduce stays on "comm"
    }
    if (e["name"] == "pp_recv_wait") EXPECT_EQ(e["args"]["comm"], "pp");  // the writer names its communicator
  }
  EXPECT_EQ(pp_events, 6 + 6);
  EXPECT_EQ((thread_names[{0, kPpTid}]), "comm pp");
  EXPECT_EQ((thread_names[{0, kPpTid + 1}]), "comm pp (concurrent #2)");  // a wait and its receive coincide
}

TEST(PipelineTrace, AnalyzeReportsThePpRowAndTheBubblePerRankNextToTheIdeal) {
  coc::test::TempDir d("pp_bubble");
  coc::test::write_file(d / "trace.json", two_stage_trace());
  const Report r = analyze_paths({d / "trace.json"}, {});
  ASSERT_EQ(r.ranks.size(), 2u);
  const int64_t bubble[2] = {30 * kUs, 20 * kUs}, pp_comm[2] = {37 * kUs, 24 * kUs}, pp_exposed[2] = {30 * kUs, 22 * kUs};
  const int64_t pp_count[2] = {6, 6};
  for (int s = 0; s < 2; ++s) {
    const RankReport& rk = r.ranks[static_cast<size_t>(s)];
    ASSERT_EQ(rk.steps.size(), 1u);
    EXPECT_EQ(rk.steps[0].pp_bubble_ns, bubble[s]) << "rank " << s;
    EXPECT_EQ(rk.total.pp_bubble_ns, bubble[s]);
    ASSERT_TRUE(rk.pipeline.has_value());
    EXPECT_EQ(rk.pipeline->stages, 2);
    EXPECT_EQ(rk.pipeline->micro_batches, 2);
    EXPECT_EQ(rk.pipeline->waits, 2);
    ASSERT_TRUE(rk.pipeline->ideal_bubble_pct().has_value());
    EXPECT_DOUBLE_EQ(*rk.pipeline->ideal_bubble_pct(), 100.0 / 3.0);
    const CommGroupStat* pp = row(rk, "pp");
    ASSERT_NE(pp, nullptr) << "rank " << s;
    EXPECT_EQ(pp->count, pp_count[s]);
    EXPECT_EQ(pp->communication_ns, pp_comm[s]);
    EXPECT_EQ(pp->exposed_ns, pp_exposed[s]);
    EXPECT_EQ(row(rk, "pp-link-act"), nullptr);  // the links are folded into "pp"
    EXPECT_EQ(row(rk, "pp-link-grad"), nullptr);
    ASSERT_NE(row(rk, "dp"), nullptr);
  }
  EXPECT_EQ(r.ranks[0].steps[0].split.exposed, 35 * kUs);

  const nlohmann::json j = nlohmann::json::parse(render_json(r));
  for (int s = 0; s < 2; ++s) {
    const auto& p = j["ranks"][s]["pipeline"];
    EXPECT_EQ(p["stages"], 2);
    EXPECT_EQ(p["micro_batches"], 2);
    EXPECT_DOUBLE_EQ(p["ideal_bubble_pct"].get<double>(), 100.0 / 3.0);
    EXPECT_EQ(p["bubble_ns"], bubble[s]);
    EXPECT_DOUBLE_EQ(p["bubble_pct"].get<double>(), s == 0 ? 30.0 : 20.0);
    EXPECT_EQ(p["steps"][0]["name"], "ProfilerStep#5");
    EXPECT_EQ(p["steps"][0]["bubble_ns"], bubble[s]);
  }
  const std::string table = render_table(r, false);
  EXPECT_NE(table.find("ideal 1F1B bubble (P − 1)/(M + P − 1) = 33.3% (P 2, M 2)"), std::string::npos) << table;
  EXPECT_NE(table.find("30.0% of the step"), std::string::npos) << table;
  const std::string html = render_html(r);
  EXPECT_NE(html.find("ideal 1F1B bubble"), std::string::npos);
  EXPECT_NE(html.find("<td>30.0</td><td>30.0%</td>"), std::string::npos);
  // msprof's columns: Bubble, and Communication(Not Overlapped and Exclude Receive) = exposed − bubble.
  const std::string csv = render_csv(r);
  EXPECT_NE(csv.find("5,rank,0,60.000,35.000,7.000,42.000,5.000,100.000,30.000,5.000,0.000"), std::string::npos) << csv;
}

// The interleaved schedule: V travels in the metadata (only when > 1) and the ideal becomes (P − 1)/(V·M + P − 1),
// here 1/5; the measured bubble is the same intervals'.
TEST(PipelineTrace, TheInterleavedIdealDividesByVTimesM) {
  EXPECT_FALSE(nlohmann::json::parse(two_stage_trace())["otherData"].contains("num_virtual_stages_per_pipeline_rank"));
  coc::test::TempDir d("pp_bubble_v");
  coc::test::write_file(d / "trace.json", two_stage_trace(2));
  const Report r = analyze_paths({d / "trace.json"}, {});
  ASSERT_EQ(r.ranks.size(), 2u);
  ASSERT_TRUE(r.ranks[0].pipeline.has_value());
  EXPECT_EQ(r.ranks[0].pipeline->virtual_stages, 2);
  EXPECT_DOUBLE_EQ(*r.ranks[0].pipeline->ideal_bubble_pct(), 20.0);
  EXPECT_EQ(r.ranks[0].total.pp_bubble_ns, 30 * kUs);
  const std::string table = render_table(r, false);
  EXPECT_NE(table.find("ideal interleaved bubble (P − 1)/(V·M + P − 1) = 20.0% (P 2, V 2, M 2)"), std::string::npos)
      << table;
  EXPECT_EQ(nlohmann::json::parse(render_json(r))["ranks"][0]["pipeline"]["virtual_stages"], 2);
}

// A trace written before the writer named the waits' communicator: a bare pp_recv_wait still counts as "pp" and as
// bubble; without P and M the ideal is unknown. A trace with no pipeline has no pipeline section.
TEST(PipelineTrace, BareWaitsCountAsPpAndTheIdealNeedsPAndM) {
  auto x = [](const char* cat, const char* name, double ts, double dur, const char* args) {
    return fmt::format(R"({{"ph":"X","cat":"{}","name":"{}","pid":0,"tid":2,"ts":{:.3f},"dur":{:.3f},"args":{}}})", cat,
                       name, ts, dur, args);
  };
  const std::string events = x("step", "ProfilerStep#1", 0, 50, "{}") + ",\n" + x("compute", "gemm", 0, 20, "{}") +
                             ",\n" + x("comm", "pp_recv_wait", 15, 25, "{}") + ",\n" +
                             x("comm", "exchange", 30, 5, R"({"comm":"pp-link-grad"})");
  coc::test::TempDir d("pp_bare");
  coc::test::write_file(d / "t.json", "{\"traceEvents\": [\n" + events +
                                          "\n], \"otherData\": {\"producer\": \"coc\"}}\n");
  const Report r = analyze_paths({d / "t.json"}, {});
  ASSERT_EQ(r.ranks.size(), 1u);
  const RankReport& rk = r.ranks[0];
  EXPECT_EQ(rk.steps[0].pp_bubble_ns, 20 * kUs);  // [20, 40): the wait less the GEMM
  ASSERT_TRUE(rk.pipeline.has_value());
  EXPECT_FALSE(rk.pipeline->ideal_bubble_pct().has_value());
  const CommGroupStat* pp = row(rk, "pp");
  ASSERT_NE(pp, nullptr);
  EXPECT_EQ(pp->count, 2);
  EXPECT_EQ(pp->communication_ns, 25 * kUs);
  EXPECT_EQ(pp->exposed_ns, 20 * kUs);
  EXPECT_NE(render_table(r, false).find("ideal unknown"), std::string::npos);
  EXPECT_TRUE(nlohmann::json::parse(render_json(r))["ranks"][0]["pipeline"]["ideal_bubble_pct"].is_null());

  coc::test::write_file(d / "t.json", "{\"traceEvents\": [\n" + x("step", "ProfilerStep#1", 0, 50, "{}") + ",\n" +
                                          x("compute", "gemm", 0, 20, "{}") +
                                          "\n], \"otherData\": {\"producer\": \"coc\"}}\n");
  const Report plain = analyze_paths({d / "t.json"}, {});
  EXPECT_FALSE(plain.ranks[0].pipeline.has_value());
  EXPECT_EQ(render_table(plain, false).find("pipeline bubble"), std::string::npos);
  EXPECT_FALSE(nlohmann::json::parse(render_json(plain))["ranks"][0].contains("pipeline"));
}

}  // namespace
}  // namespace coc::analysis
