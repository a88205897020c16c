// coc's own trace format (docs/profiling.md): a merged two-rank file, its "Overlap Analysis" lanes reproduced
// by our split; the cross-rank balance, the waits for a later rank, the verdicts and the folder expansion of
// analyze_paths.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>

#include <nlohmann/json.hpp>

#include "../../src/analysis/event_classify.h"
#include "coc/analysis/analyze.h"
#include "support/temp_dir.h"
#include "trace_test_util.h"

using namespace coc::analysis;

namespace {

std::string x(const char* cat, const std::string& name, int pid, int tid, double ts, double dur) {
  return fmt::format(R"({{"ph":"X","cat":"{}","name":"{}","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},"args":{{}}}})",
                     cat, name, pid, tid, ts, dur);
}

// Rank r: step [0, 100) µs; GEMM [10, 50) and [60, 70) on tid 1; all-reduce [40, 80) on tid 2; step scaled by
// `stretch` to make one rank slower. Lanes: Computing 50, Communication 40, Not Overlapped 20, Free 30.
std::string rank_events(int r, double stretch) {
  auto s = [&](double v) { return v * stretch; };
  std::string e;
  e += R"({"ph":"M","name":"process_name","pid":)" + std::to_string(r) + R"(,"args":{"name":"rank )" + std::to_string(r) + "\"}},\n";
  e += x("step", "ProfilerStep#3", r, 0, 0, s(100)) + ",\n";
  e += x("compute", "gemm_chunk", r, 1, s(10), s(40)) + ",\n";
  e += x("compute", "gemm_chunk", r, 1, s(60), s(10)) + ",\n";
  e += x("comm", "all_reduce", r, 2, s(40), s(40)) + ",\n";
  const int ov = 1000000 + r;
  e += x("overlap_analysis", "Computing", ov, 0, s(10), s(40)) + ",\n";
  e += x("overlap_analysis", "Computing", ov, 0, s(60), s(10)) + ",\n";
  e += x("overlap_analysis", "Communication", ov, 1, s(40), s(40)) + ",\n";
  e += x("overlap_analysis", "Communication(Not Overlapped)", ov, 2, s(50), s(10)) + ",\n";
  e += x("overlap_analysis", "Communication(Not Overlapped)", ov, 2, s(70), s(10)) + ",\n";
  e += x("overlap_analysis", "Free", ov, 3, 0, s(10)) + ",\n";
  e += x("overlap_analysis", "Free", ov, 3, s(80), s(20));
  return e;
}

std::string merged(double stretch1) {
  return "{\"traceEvents\": [\n" + rank_events(0, 1.0) + ",\n" + rank_events(1, stretch1) +
         "\n], \"displayTimeUnit\": \"ns\", \"otherData\": {\"producer\": \"coc\", \"world_size\": 2}}\n";
}

TEST(AnalyzeCocTrace, MergedFileGivesOneReportPerRankAndMatchesItsLanes) {
  coc::test::TempDir d("coc_own");
  coc::test::write_file(d / "trace.json", merged(1.0));
  const auto ranks = analyze_file(d / "trace.json", {});
  ASSERT_EQ(ranks.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const RankReport& k = ranks[r];
    EXPECT_EQ(k.rank, r);
    EXPECT_EQ(k.format, TraceFormat::kCoc);
    ASSERT_EQ(k.steps.size(), 1u);
    const OverlapBreakdown& s = k.steps[0].split;
    EXPECT_EQ(s.window, 100'000);
    EXPECT_EQ(s.computing, 50'000);
    EXPECT_EQ(s.communication, 40'000);
    EXPECT_EQ(s.exposed, 20'000);
    EXPECT_EQ(s.free, 30'000);
    EXPECT_DOUBLE_EQ(s.overlap_pct(), 50.0);
    ASSERT_TRUE(k.vendor_overlap_lanes.has_value());
    EXPECT_EQ(k.vendor_overlap_lanes->computing, s.computing);
    EXPECT_EQ(k.vendor_overlap_lanes->exposed, s.exposed);
    EXPECT_EQ(k.vendor_overlap_lanes->free, s.free);
    EXPECT_EQ(k.vendor_overlap_lanes->communication, s.communication);
    // Lanes for the timeline: 2 computing, 1 communication, 2 not overlapped, 2 free.
    EXPECT_EQ(k.lanes.size(), 7u);
    const Verdict v = verdict_of(k.steps[0]);
    EXPECT_EQ(v.exposed, "watch");     // 20%: in (10%, 20%]
    EXPECT_EQ(v.free, "host-bound?");  // 30% ≥ 3%
  }
}

// Free is explained, not changed: the step of rank_events has Free [0, 10) and [80, 100) µs; host work ("data")
// over [0, 8) and a "logging" span [85, 95) that half-overlaps nothing busy make 18 µs of the 30 µs host work; the
// longest gap [80, 100) opens after the all-reduce and ends at the step's end.
TEST(AnalyzeCocTrace, FreeIsSplitIntoHostWorkAndIdleWithTheLongestGapsNamed) {
  coc::test::TempDir d("coc_own");
  std::string ev = rank_events(0, 1.0);
  ev += ",\n" + x("host_work", "data", 0, 0, 0, 8) + ",\n" + x("host_work", "logging", 0, 0, 85, 10) + ",\n" +
        x("host_work", "data", 0, 0, 20, 5);  // inside compute: not Free, so not counted
  coc::test::write_file(d / "t.json", "{\"traceEvents\": [\n" + ev +
                                          "\n], \"otherData\": {\"producer\": \"coc\", \"world_size\": 1}}\n");
  const auto ranks = analyze_file(d / "t.json", {});
  ASSERT_EQ(ranks.size(), 1u);
  const RankReport& k = ranks[0];
  EXPECT_EQ(k.total.split.free, 30'000);  // unchanged by host work
  EXPECT_EQ(k.total.host_work_ns, 18'000);
  EXPECT_EQ(k.steps[0].host_work_ns, 18'000);
  ASSERT_EQ(k.host_work.size(), 2u);
  EXPECT_EQ(k.host_work[0].name, "logging");
  EXPECT_EQ(k.host_work[0].free_ns, 10'000);
  EXPECT_EQ(k.host_work[1].name, "data");
  EXPECT_EQ(k.host_work[1].count, 2);
  EXPECT_EQ(k.host_work[1].free_ns, 8'000);
  ASSERT_EQ(k.free_gaps.size(), 2u);
  EXPECT_EQ(k.free_gaps[0].begin_ns, 80'000);
  EXPECT_EQ(k.free_gaps[0].end_ns, 100'000);
  EXPECT_EQ(k.free_gaps[0].after, "all_reduce");
  EXPECT_EQ(k.free_gaps[0].before, "");
  EXPECT_EQ(k.free_gaps[0].host_work, "logging");
  EXPECT_EQ(k.free_gaps[1].begin_ns, 0);
  EXPECT_EQ(k.free_gaps[1].before, "gemm_chunk");
  EXPECT_EQ(k.free_gaps[1].host_work, "data");
  Report r;
  r.ranks = ranks;
  const std::string t = render_table(r, false);
  EXPECT_NE(t.find("free 30.0 µs (30.0%) = host work 18.0 µs (logging 10.0 µs, data 8.0 µs) + idle 12.0 µs; longest: "
                   "20.0 µs at 80.0 µs (after all_reduce, before the step end; logging), 10.0 µs at 0.0 µs (after the "
                   "step start, before gemm_chunk; data)"),
            std::string::npos)
      << t;
}

// --coc-parallel-num auto's timing (host "coc_auto_timing", inside a "coc_auto_choice") marks its step, and the
// rank's notes give the other steps' totals, as `coc train --profile` logs its steady state. Step 3 is rank_events'
// [0, 100) µs (exposed 20, free 30) with a timing; step 4 [100, 200) µs has a GEMM over [100, 190) and an
// all-reduce over [180, 200) (exposed 10, free 0).
TEST(AnalyzeCocTrace, StepsWhereAutoTimedItsCandidatesAreNotedApart) {
  coc::test::TempDir d("coc_own");
  std::string ev = rank_events(0, 1.0);
  ev += ",\n" + x("step", "ProfilerStep#4", 0, 0, 100, 100) + ",\n" + x("compute", "gemm", 0, 1, 100, 90) + ",\n" +
        x("comm", "all_reduce", 0, 2, 180, 20) + ",\n" + x("host", "coc_auto_choice", 0, 0, 5, 60) + ",\n" +
        x("host", "coc_auto_timing", 0, 0, 6, 58) + ",\n" + x("host", "coc_auto_choice", 0, 0, 150, 1);
  coc::test::write_file(d / "t.json", "{\"traceEvents\": [\n" + ev +
                                          "\n], \"otherData\": {\"producer\": \"coc\", \"world_size\": 1}}\n");
  const auto ranks = analyze_file(d / "t.json", {});
  ASSERT_EQ(ranks.size(), 1u);
  const RankReport& k = ranks[0];
  ASSERT_EQ(k.steps.size(), 2u);
  EXPECT_TRUE(k.steps[0].auto_timing);
  EXPECT_FALSE(k.steps[1].auto_timing);  // a choice without timing (a cache hit) does not count
  EXPECT_EQ(k.total.split.exposed, 30'000);  // the totals keep every step
  bool noted = false;
  for (const std::string& n : k.notes)
    noted |= n == "--coc-parallel-num auto timed its candidates in ProfilerStep#3 (once per shape); the other 1 step: "
                  "computing 90.0%, exposed 10.0% (ok), free 0.0% (ok)";
  EXPECT_TRUE(noted) << ::testing::PrintToString(k.notes);

  // Every step timed: the note says to profile later steps.
  std::string all = rank_events(0, 1.0) + ",\n" + x("host", "coc_auto_timing", 0, 0, 6, 58);
  coc::test::write_file(d / "a.json", "{\"traceEvents\": [\n" + all +
                                          "\n], \"otherData\": {\"producer\": \"coc\", \"world_size\": 1}}\n");
  const auto timed = analyze_file(d / "a.json", {});
  bool later = false;
  for (const std::string& n : timed[0].notes)
    later |= n == "--coc-parallel-num auto timed its candidates in ProfilerStep#3, every step here: profile later "
                  "steps for the steady state";
  EXPECT_TRUE(later) << ::testing::PrintToString(timed[0].notes);

  // No timing: no note, no mark.
  coc::test::write_file(d / "u.json", "{\"traceEvents\": [\n" + rank_events(0, 1.0) +
                                          "\n], \"otherData\": {\"producer\": \"coc\", \"world_size\": 1}}\n");
  const auto plain = analyze_file(d / "u.json", {});
  EXPECT_FALSE(plain[0].steps[0].auto_timing);
  for (const std::string& n : plain[0].notes) EXPECT_EQ(n.find("auto timed"), std::string::npos) << n;
}

// Which communicator the exposed time came from. The step of rank_events computes over [10, 50) and [60, 70) µs.
// "tp" collectives over [40, 80) (exposed [50, 60) and [70, 80): 20 µs) and "fsdp dp-cp" ones over [0, 30) and
// [20, 45) (one interval [0, 45), exposed [0, 10): 10 µs); a "dp" collective after the step is outside the span.
// A Kineto NCCL kernel's group is its process group's description, else its name.
TEST(AnalyzeCocTrace, CommunicationIsSplitByCommunicator) {
  coc::test::TempDir d("coc_own");
  auto comm = [](const char* group, double ts, double dur) {
    return fmt::format(R"({{"ph":"X","cat":"comm","name":"all_gather","pid":0,"tid":2,"ts":{:.3f},"dur":{:.3f},)"
                       R"("args":{{"op":"all_gather","comm":"{}"}}}})",
                       ts, dur, group);
  };
  std::string ev = "{\"traceEvents\": [\n" + x("step", "ProfilerStep#3", 0, 0, 0, 100) + ",\n" +
                   x("compute", "gemm", 0, 1, 10, 40) + ",\n" + x("compute", "gemm", 0, 1, 60, 10) + ",\n" +
                   comm("tp", 40, 40) + ",\n" + comm("fsdp dp-cp", 0, 30) + ",\n" + comm("fsdp dp-cp", 20, 25) +
                   ",\n" + comm("dp", 120, 10) + "\n], \"otherData\": {\"producer\": \"coc\", \"world_size\": 1}}\n";
  coc::test::write_file(d / "t.json", ev);
  const auto ranks = analyze_file(d / "t.json", {});
  ASSERT_EQ(ranks.size(), 1u);
  const auto& g = ranks[0].comm_groups;
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].name, "tp");
  EXPECT_EQ(g[0].count, 1);
  EXPECT_EQ(g[0].communication_ns, 40'000);
  EXPECT_EQ(g[0].exposed_ns, 20'000);
  EXPECT_EQ(g[1].name, "fsdp dp-cp");
  EXPECT_EQ(g[1].count, 2);
  EXPECT_EQ(g[1].communication_ns, 45'000);
  EXPECT_EQ(g[1].exposed_ns, 10'000);
  Report r;
  r.ranks = ranks;
  const std::string t = render_table(r, false);
  EXPECT_NE(t.find("fsdp dp-cp                           45.0 µs in      2 collective(s), exposed         10.0 µs "
                   "(22%), hidden 78%"),
            std::string::npos)
      << t;
  EXPECT_NE(render_json(r).find(R"("comm_groups")"), std::string::npos);
  EXPECT_NE(render_html(r).find("<td class=\"name\">fsdp dp-cp</td><td>2</td><td>45.0</td><td>10.0</td><td>22</td>"),
            std::string::npos);
  // Control bytes in a communicator's name never reach the terminal raw.
  r.ranks[0].comm_groups[0].name = "a\x1b[31m\nb";
  EXPECT_NE(render_table(r, false).find("a\\x1b[31m\\x0ab"), std::string::npos) << render_table(r, false);

  // Kineto: NCCL kernels on a GPU stream, one with a description, one with only a name, one with an unquoted name.
  auto nccl = [](const char* pg, double ts) {
    return fmt::format(R"({{"ph":"X","cat":"kernel","name":"ncclDevKernel_AllReduce","pid":0,"tid":7,"ts":{:.3f},)"
                       R"("dur":10,"args":{{"stream":7,"correlation":{},{}}}}})",
                       ts, static_cast<int>(ts), pg);
  };
  coc::test::write_file(d / "k.json", "{\"traceEvents\": [\n" +
                                          nccl(R"("Process Group Name":"0","Process Group Description":"default_pg")", 10) +
                                          ",\n" + nccl(R"("Process Group Name":"3")", 30) + ",\n" +
                                          nccl(R"("Process Group Name":7)", 50) + "\n]}\n");
  const auto k = analyze_file(d / "k.json", {});
  ASSERT_EQ(k.size(), 1u);
  ASSERT_EQ(k[0].comm_groups.size(), 3u);
  EXPECT_EQ(k[0].comm_groups[0].name, "3");  // equal exposure: by name
  EXPECT_EQ(k[0].comm_groups[1].name, "7");
  EXPECT_EQ(k[0].comm_groups[2].name, "default_pg");
  EXPECT_EQ(k[0].comm_groups[2].exposed_ns, 10'000);
}

// Which operation the exposed time came from. Step [0, 100) µs, compute over [10, 50) and [60, 70) µs.
//  - mlp.down fwd, one exchange over two layers: layer 0's receives [40, 55) and layer 1's sends [52, 65) (one union
//    [40, 65): 25 µs; exposed [50, 60): 10 µs);
//  - attention.qkv fwd, an all-gather of layers 0 and 3: [0, 20) and [65, 90) (45 µs; exposed [0, 10) and [70, 90):
//    30 µs);
//  - embedding fwd weight: [95, 97) (2 µs, all exposed); an untagged pp_recv_wait [97, 99) (2 µs, all exposed).
// mlp.down's receives and sends overlap over [52, 55), which its union counts once; no two ops are exposed at once,
// so here their exposed times (30 + 10 + 2 + 2) add up to the step's 44 µs.
TEST(AnalyzeCocTrace, ExposedCommunicationIsSplitByOperationWithLayersFolded) {
  coc::test::TempDir d("coc_own");
  auto comm = [](const char* name, const char* comm_name, const std::string& tag, double ts, double dur) {
    std::string args = fmt::format(R"("op":"{}","comm":"{}")", name, comm_name);
    if (!tag.empty()) args += fmt::format(R"(,"tag":"{}")", tag);
    return fmt::format(R"({{"ph":"X","cat":"comm","name":"{}","pid":0,"tid":2,"ts":{:.3f},"dur":{:.3f},)"
                       R"("args":{{{}}}}})",
                       name, ts, dur, args);
  };
  const std::string ev =
      "{\"traceEvents\": [\n" + x("step", "ProfilerStep#3", 0, 0, 0, 100) + ",\n" + x("compute", "gemm", 0, 1, 10, 40) +
      ",\n" + x("compute", "gemm", 0, 1, 60, 10) + ",\n" +
      comm("exchange_recvs", "tp", "layers.0.mlp.down fwd chunk 1/2 [4, 8] recv", 40, 15) + ",\n" +
      comm("exchange_sends", "tp", "layers.1.mlp.down fwd chunk 2/2 [4, 8]", 52, 13) + ",\n" +
      comm("all_gather.bf16", "tp", "layers.0.attention.qkv fwd chunk 1/2 [4, 8]", 0, 20) + ",\n" +
      comm("all_gather.bf16", "tp", "layers.3.attention.qkv fwd chunk 2/2 [4, 8]", 65, 25) + ",\n" +
      comm("all_gather", "tp", "embedding fwd weight", 95, 2) + ",\n" + comm("pp_recv_wait", "pp", "", 97, 2) +
      "\n], \"otherData\": {\"producer\": \"coc\", \"world_size\": 1}}\n";
  coc::test::write_file(d / "t.json", ev);
  const auto ranks = analyze_file(d / "t.json", {});
  ASSERT_EQ(ranks.size(), 1u);
  const auto& o = ranks[0].comm_ops;
  ASSERT_EQ(o.size(), 4u);
  EXPECT_EQ(o[0].op, "layers.*.attention.qkv fwd");
  EXPECT_EQ(o[0].collective, "all_gather");
  EXPECT_EQ(o[0].communicator, "tp");
  EXPECT_EQ(o[0].count, 2);
  EXPECT_EQ(o[0].communication_ns, 45'000);
  EXPECT_EQ(o[0].exposed_ns, 30'000);
  EXPECT_EQ(o[1].op, "layers.*.mlp.down fwd");
  EXPECT_EQ(o[1].collective, "exchange");
  EXPECT_EQ(o[1].count, 2);
  EXPECT_EQ(o[1].communication_ns, 25'000);
  EXPECT_EQ(o[1].exposed_ns, 10'000);
  // Equal exposure: by op, the untagged ("") first.
  EXPECT_EQ(o[2].op, "");
  EXPECT_EQ(o[2].collective, "pp_recv_wait");
  EXPECT_EQ(o[2].communicator, "pp");
  EXPECT_EQ(o[2].exposed_ns, 2'000);
  EXPECT_EQ(o[3].op, "embedding fwd weight");
  EXPECT_EQ(o[3].communication_ns, 2'000);
  EXPECT_EQ(o[3].exposed_ns, 2'000);
  EXPECT_EQ(ranks[0].total.split.exposed, 44'000);

  Report r;
  r.ranks = ranks;
  const std::string t = render_table(r, false);
  EXPECT_NE(t.find("exposed communication by operation (layers.<i>. folded into layers.*.; exposed = not overlapped by "
                   "compute; ops may be exposed at once), top 4 of 4:"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("    layers.*.attention.qkv fwd               all_gather       tp                 45.0       2 "
                   "        30.0      67%\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("    (untagged)                               pp_recv_wait     pp"), std::string::npos) << t;
  const nlohmann::json j = nlohmann::json::parse(render_json(r));
  ASSERT_EQ(j["ranks"][0]["comm_ops"].size(), 4u);
  EXPECT_EQ(j["ranks"][0]["comm_ops"][1]["op"], "layers.*.mlp.down fwd");
  EXPECT_EQ(j["ranks"][0]["comm_ops"][1]["exposed_ns"], 10'000);
  EXPECT_NE(render_html(r).find("<td class=\"name\">layers.*.mlp.down fwd</td><td>exchange</td><td>tp</td><td>2</td>"
                                "<td>25.0</td><td>10.0</td><td>40</td>"),
            std::string::npos);

  // Beyond 8 ops the table sums the rest in one line; --json keeps them all.
  for (int i = 0; i < 7; ++i)
    r.ranks[0].comm_ops.push_back({fmt::format("op{}", i), "all_reduce", "dp", 1, 3'000, 1'000});
  const std::string many = render_table(r, false);
  EXPECT_NE(many.find("top 8 of 11:"), std::string::npos) << many;
  EXPECT_NE(many.find("    3 more operation(s)"), std::string::npos) << many;
  EXPECT_NE(many.find("         9.0       3          3.0 (sums)"), std::string::npos) << many;
  EXPECT_EQ(nlohmann::json::parse(render_json(r))["ranks"][0]["comm_ops"].size(), 11u);

  // A trace without tags has no per-op rows (the communicator rows stay).
  coc::test::write_file(d / "u.json", merged(1.0));
  EXPECT_TRUE(analyze_file(d / "u.json", {})[0].comm_ops.empty());
}

// The op of a tag: counters, shapes, send/recv qualifiers and hop numbers go; layer indices fold; phases stay.
TEST(AnalyzeCocTrace, OpOfATag) {
  using coc::analysis::detail::comm_collective;
  using coc::analysis::detail::comm_op_name;
  EXPECT_EQ(comm_op_name("layers.1.mlp.down fwd chunk 16/16 [256, 512] recv"), "layers.*.mlp.down fwd");
  EXPECT_EQ(comm_op_name("layers.12.attention.dense bwd dY segment 1/4"), "layers.*.attention.dense bwd dY");
  EXPECT_EQ(comm_op_name("layers.0.attention.dense fwd chunk 2/4 [64, 128] scatter recv"),
            "layers.*.attention.dense fwd scatter");
  EXPECT_EQ(comm_op_name("layers.3.attention.core kv inner 2"), "layers.*.attention.core kv inner");
  EXPECT_EQ(comm_op_name("sp grad layers.10.input_layernorm.weight"), "sp grad layers.*.input_layernorm.weight");
  EXPECT_EQ(comm_op_name("embedding fwd weight"), "embedding fwd weight");
  EXPECT_EQ(comm_op_name("layers.x.chunk 3/x"), "layers.x.chunk 3/x");  // not a layer index, not a counter
  EXPECT_EQ(comm_op_name(""), "");
  EXPECT_EQ(comm_collective("all_gather.bf16"), "all_gather");
  EXPECT_EQ(comm_collective("exchange_recvs"), "exchange");
  EXPECT_EQ(comm_collective("exchange_sends"), "exchange");
  EXPECT_EQ(comm_collective("all_gather_bytes"), "all_gather");
  EXPECT_EQ(comm_collective("all_reduce_max"), "all_reduce_max");
  EXPECT_EQ(comm_collective("pp_recv_wait"), "pp_recv_wait");
}

TEST(AnalyzeCocTrace, BalanceFlagsASlowRank) {
  coc::test::TempDir d("coc_own");
  coc::test::write_file(d / "even.json", merged(1.04));
  Report even = analyze_paths({d / "even.json"}, {});
  EXPECT_FALSE(even.slow_rank);
  coc::test::write_file(d / "slow.json", merged(1.10));
  Report slow = analyze_paths({d / "slow.json"}, {});
  EXPECT_TRUE(slow.slow_rank);
  EXPECT_EQ(slow.slowest_rank, 1);
  EXPECT_EQ(slow.fastest_rank, 0);
  ASSERT_FALSE(slow.top_kernels.empty());
  EXPECT_EQ(slow.top_kernels[0].name, "gemm_chunk");
  EXPECT_EQ(slow.top_kernels[0].count, 4);
}

// A collective of rank `r` on communicator "tp", as coc traces it (docs/profiling.md): args comm, seq, group_root.
std::string coll(int r, int group_root, int seq, double ts, double dur) {
  return fmt::format(R"({{"ph":"X","cat":"comm","name":"all_reduce","pid":{},"tid":2,"ts":{:.3f},"dur":{:.3f},)"
                     R"("args":{{"op":"all_reduce","comm":"tp","seq":{},"group_root":{},"tag":"t"}}}})",
                     r, ts, dur, seq, group_root);
}

// Two tp groups of one name, {0, 1} and {2, 3}, each running its collective seq 5 (µs):
//   rank 0: compute [0, 20), posts at 20; rank 1: compute [0, 40), posts at 40; both complete at 60;
//   rank 2: posts at 10; rank 3: compute [0, 30), posts at 30; both complete at 50.
// Rank 0 waits [20, 40) for rank 1 and rank 2 [10, 30) for rank 3. Matched by (comm, seq) alone, rank 2 would
// wait for rank 1's post at 40 instead. Step [0, 100) on every rank; rank 1 computes most (40 µs).
std::string two_groups(bool with_keys) {
  std::string e = "{\"traceEvents\": [\n";
  for (int r = 0; r < 4; ++r) e += x("step", "ProfilerStep#1", r, 0, 0, 100) + ",\n";
  e += x("compute", "gemm", 0, 1, 0, 20) + ",\n" + x("compute", "gemm", 1, 1, 0, 40) + ",\n";
  e += x("compute", "gemm", 2, 1, 0, 1) + ",\n" + x("compute", "gemm", 3, 1, 0, 30) + ",\n";
  if (with_keys) {
    e += coll(0, 0, 5, 20, 40) + ",\n" + coll(1, 0, 5, 40, 20) + ",\n";
    e += coll(2, 2, 5, 10, 40) + ",\n" + coll(3, 2, 5, 30, 20);
  } else {
    e += x("comm", "all_reduce", 0, 2, 20, 40) + ",\n" + x("comm", "all_reduce", 1, 2, 40, 20);
  }
  return e + "\n], \"otherData\": {\"producer\": \"coc\"}}\n";
}

TEST(AnalyzeCocTrace, ExposedTimeWaitingForALaterRankIsMatchedPerGroup) {
  coc::test::TempDir d("coc_own");
  coc::test::write_file(d / "t.json", two_groups(true));
  const Report r = analyze_paths({d / "t.json"}, {});
  ASSERT_EQ(r.ranks.size(), 4u);
  const int64_t want_wait[] = {20'000, 0, 20'000, 0}, want_exposed[] = {40'000, 20'000, 40'000, 20'000};
  const int want_late[] = {1, -1, 3, -1};
  for (int k = 0; k < 4; ++k) {
    const RankReport& rk = r.ranks[static_cast<size_t>(k)];
    SCOPED_TRACE(k);
    EXPECT_EQ(rk.total.split.exposed, want_exposed[k]);
    EXPECT_EQ(rk.total.late_wait_ns, want_wait[k]);
    ASSERT_EQ(rk.steps.size(), 1u);
    EXPECT_EQ(rk.steps[0].late_wait_ns, want_wait[k]);
    EXPECT_EQ(rk.waited_for_rank, want_late[k]);
    EXPECT_TRUE(rk.posts.empty());  // inputs, freed
  }
  EXPECT_EQ(r.least_compute_rank, 2);
  EXPECT_EQ(r.most_compute_rank, 1);
  EXPECT_EQ(r.most_compute_ns, 40'000);
  EXPECT_TRUE(r.unequal_compute);
  const std::string t = render_table(r, false);
  EXPECT_NE(t.find("exposed while a later rank had not posted the collective: 20.0 µs (20.0% of the time), most of it "
                   "for rank 1 (20.0 µs); after every rank had posted: 20.0 µs (20.0%)"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("no rank was late"), std::string::npos) << t;
  EXPECT_NE(t.find("compute balance: computing 1.0 µs (rank 2) to 40.0 µs (rank 1), spread 3900.0%: unequal"),
            std::string::npos)
      << t;
  const nlohmann::json j = nlohmann::json::parse(render_json(r));
  EXPECT_EQ(j["ranks"][0]["total"]["late_wait_ns"], 20'000);
  EXPECT_EQ(j["ranks"][0]["waited_for"]["rank"], 1);
  EXPECT_EQ(j["ranks"][0]["comm_ops"][0]["late_wait_ns"], 20'000);  // the op's share: all of it here
  EXPECT_EQ(j["ranks"][1]["comm_ops"][0]["late_wait_ns"], 0);
  EXPECT_NE(t.find("waiting µs"), std::string::npos) << t;
  EXPECT_EQ(j["balance"]["most_compute_rank"], 1);
}

// Rank 3 left out of the file (a partial --profile-ranks): rank 2's collective has no partner to match, so its
// exposed time is shown apart, and with nothing matched the figure is unknown, with a note saying why. Ranks 0 and 1
// keep theirs. A rank alone in its file of a larger run gets a note too.
TEST(AnalyzeCocTrace, UnmatchedCollectivesAreShownApartAndLoneRanksNoted) {
  coc::test::TempDir d("coc_own");
  std::string t = two_groups(true);
  const std::string rank3 = ",\n" + coll(3, 2, 5, 30, 20);
  t.erase(t.find(rank3), rank3.size());
  const std::string extra = coll(2, 0, 7, 60, 20);  // rank 2 in group 0's collective 7, which no other rank traced
  t.insert(t.find("\n]"), ",\n" + extra);
  coc::test::write_file(d / "t.json", t);
  const Report r = analyze_paths({d / "t.json"}, {});
  ASSERT_EQ(r.ranks.size(), 4u);
  EXPECT_EQ(r.ranks[0].total.late_wait_ns, 20'000);
  EXPECT_EQ(r.ranks[0].unmatched_ns, 0);
  const RankReport& r2 = r.ranks[2];
  EXPECT_EQ(r2.total.late_wait_ns, -1);
  ASSERT_FALSE(r2.notes.empty());
  EXPECT_NE(r2.notes.back().find("none of this rank's 2 collectives appears on another rank"), std::string::npos)
      << r2.notes.back();

  // Rank 0 traced a collective (9) that rank 1 did not: its exposed time is unmatched, apart from the rest.
  std::string u = two_groups(true);
  u.insert(u.find("\n]"), ",\n" + coll(0, 0, 9, 70, 20));
  coc::test::write_file(d / "u.json", u);
  const Report ru = analyze_paths({d / "u.json"}, {});
  EXPECT_EQ(ru.ranks[0].total.late_wait_ns, 20'000);
  EXPECT_EQ(ru.ranks[0].unmatched_ns, 20'000);
  EXPECT_NE(render_table(ru, false).find("after every rank had posted: 20.0 µs (20.0%); in collectives no other rank "
                                         "of the file traced (a partial --profile-ranks?): 20.0 µs (20.0%)"),
            std::string::npos)
      << render_table(ru, false);

  // One rank per file, from a run of two: each gets a note, not a figure.
  std::string lone = "{\"traceEvents\": [\n" + x("step", "ProfilerStep#1", 0, 0, 0, 100) + ",\n" +
                     coll(0, 0, 5, 20, 40) + "\n], \"otherData\": {\"producer\": \"coc\", \"world_size\": 2}}\n";
  coc::test::write_file(d / "lone.json", lone);
  const Report rl = analyze_paths({d / "lone.json"}, {});
  ASSERT_EQ(rl.ranks.size(), 1u);
  EXPECT_EQ(rl.ranks[0].total.late_wait_ns, -1);
  ASSERT_FALSE(rl.ranks[0].notes.empty());
  EXPECT_NE(rl.ranks[0].notes.back().find("this file holds rank 0 alone"), std::string::npos);
  // The same from a run of one rank: nothing to say.
  lone.replace(lone.find("\"world_size\": 2"), 15, "\"world_size\": 1");
  coc::test::write_file(d / "one.json", lone);
  EXPECT_TRUE(analyze_paths({d / "one.json"}, {}).ranks[0].notes.empty());
}

// Under --convention hta the total spans the whole trace while the steps leave out the last one: the wait and the
// rest of the exposed time are both counted over the total's window, so they add up to its exposed time.
TEST(AnalyzeCocTrace, LateWaitsFollowTheTotalsWindowUnderHta) {
  coc::test::TempDir d("coc_own");
  std::string t = "{\"traceEvents\": [\n";
  for (int r = 0; r < 2; ++r) {
    t += x("step", "ProfilerStep#1", r, 0, 0, 100) + ",\n" + x("step", "ProfilerStep#2", r, 0, 100, 100) + ",\n";
    t += x("compute", "gemm", r, 1, 0, r == 0 ? 20 : 40) + ",\n" + x("compute", "gemm", r, 1, 100, r == 0 ? 20 : 40) +
         ",\n";
  }
  t += coll(0, 0, 1, 20, 40) + ",\n" + coll(1, 0, 1, 40, 20) + ",\n" + coll(0, 0, 2, 120, 40) + ",\n" +
       coll(1, 0, 2, 140, 20);
  t += "\n], \"otherData\": {\"producer\": \"coc\"}}\n";
  coc::test::write_file(d / "t.json", t);
  AnalyzeOptions o;
  o.convention = Convention::kHta;
  const Report r = analyze_paths({d / "t.json"}, o);
  const RankReport& r0 = r.ranks[0];
  ASSERT_TRUE(r0.hta_last_step_dropped);
  EXPECT_EQ(r0.total.split.exposed, 80'000);   // both steps' all-reduces: the total is the whole trace
  EXPECT_EQ(r0.total.late_wait_ns, 40'000);    // [20, 40) and [120, 140)
  ASSERT_EQ(r0.steps.size(), 1u);
  EXPECT_EQ(r0.steps[0].late_wait_ns, 20'000);
  EXPECT_EQ(r0.comm_ops[0].exposed_ns, 40'000);  // the op rows cover the kept step
  EXPECT_EQ(r0.comm_ops[0].late_wait_ns, 20'000);
}

// A trace whose collectives carry no group_root / seq (older coc traces): the wait is unknown, and not printed.
TEST(AnalyzeCocTrace, LateRankWaitIsUnknownWithoutCollectiveKeys) {
  coc::test::TempDir d("coc_own");
  coc::test::write_file(d / "t.json", two_groups(false));
  const Report r = analyze_paths({d / "t.json"}, {});
  ASSERT_EQ(r.ranks.size(), 4u);
  EXPECT_EQ(r.ranks[0].total.late_wait_ns, -1);
  EXPECT_EQ(r.ranks[0].waited_for_rank, -1);
  EXPECT_EQ(render_table(r, false).find("later rank"), std::string::npos);
  EXPECT_EQ(render_table(r, false).find("waiting µs"), std::string::npos);
  EXPECT_FALSE(nlohmann::json::parse(render_json(r))["ranks"][0]["total"].contains("late_wait_ns"));
  // Keys out of range or not numbers (a hand-edited or foreign file) count as absent: no wait, no error.
  std::string bad = two_groups(true);
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {R"("seq":5,"group_root":0)", R"("seq":"five","group_root":0)"},
           {R"("seq":5,"group_root":2)", R"("seq":1099511627776,"group_root":2)"}}) {
    for (size_t at = bad.find(from); at != std::string::npos; at = bad.find(from)) bad.replace(at, from.size(), to);
  }
  coc::test::write_file(d / "bad.json", bad);
  const Report rb = analyze_paths({d / "bad.json"}, {});
  ASSERT_EQ(rb.ranks.size(), 4u);
  for (const RankReport& rk : rb.ranks) EXPECT_EQ(rk.total.late_wait_ns, -1) << rk.rank;
  EXPECT_EQ(rb.ranks[0].malformed_events, 0);
  // analyze_file alone makes no cross-rank pass: with keys the wait is still unknown there.
  coc::test::write_file(d / "k.json", two_groups(true));
  const std::vector<RankReport> one = analyze_file(d / "k.json", {});
  EXPECT_EQ(one[0].total.late_wait_ns, -1);
}

TEST(AnalyzeCocTrace, VerdictThresholds) {
  StepReport s;
  s.split.window = 1000;
  s.split.exposed = 100;
  s.split.free = 29;
  EXPECT_EQ(verdict_of(s).exposed, "ok");
  EXPECT_EQ(verdict_of(s).free, "ok");
  s.split.exposed = 200;
  s.split.free = 30;
  EXPECT_EQ(verdict_of(s).exposed, "watch");
  EXPECT_EQ(verdict_of(s).free, "host-bound?");
  s.split.exposed = 201;
  EXPECT_EQ(verdict_of(s).exposed, "needs work");
}

TEST(AnalyzeCocTrace, FolderOfFilesIsAnalysedInParallelWithProgress) {
  coc::test::TempDir d("coc_own");
  for (int r = 0; r < 4; ++r) {
    std::string ev = rank_events(0, 1.0 + 0.01 * r);
    coc::test::write_gz(d / fmt::format("rank_{}.json.gz", r),
                        "{\"traceEvents\": [\n" + ev + "\n], \"distributedInfo\": {\"rank\": " + std::to_string(r) + "}}");
  }
  coc::test::write_file(d / "notes.txt", "not a trace");
  AnalyzeOptions opt;
  opt.threads = 3;
  std::atomic<int> calls{0};
  opt.progress = [&](const std::string&, uint64_t done, uint64_t total) {
    EXPECT_LE(done, total);
    ++calls;
  };
  const Report rep = analyze_paths({d.path}, opt);
  ASSERT_EQ(rep.ranks.size(), 4u);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(rep.ranks[r].rank, r);
  EXPECT_GE(calls.load(), 4);
  EXPECT_FALSE(rep.slow_rank);  // 3% spread
}

}  // namespace
