// coc's own trace format (docs/profiling.md): a merged two-rank file, its "Overlap Analysis" lanes reproduced
// by our split; the cross-rank balance, the verdicts and the folder expansion of analyze_paths.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>

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
