// Edge cases 20–31 of docs/edge-cases.md ("Trace analysis"), each on its named fixture. The KinetoEdgeCases tests run
// on both trace sets of trace_test_util.h: coc's synthetic fixtures (tests/analysis/data/kineto, always) and the real
// traces in ../shared/traces/kineto (skipped with a message when that folder is absent); the TraceEdgeCases tests
// write their own small traces.
// coc-test-timeout: 300
#include <gtest/gtest.h>

#include "coc/analysis/analyze.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "trace_test_util.h"

using namespace coc::analysis;

namespace {

RankReport one(const std::string& path, Convention conv = Convention::kExact, AnalyzeOptions opt = {}) {
  opt.convention = conv;
  auto v = analyze_file(path, opt);
  EXPECT_EQ(v.size(), 1u);
  return v.at(0);
}

bool has_note(const RankReport& r, const std::string& part) {
  for (const std::string& n : r.notes)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

std::string kineto_json(const std::string& events, const std::string& extra = "") {
  return "{\"schemaVersion\": 1, " + extra + "\"traceEvents\": [\n" + events + "\n]}\n";
}

std::string kernel(const std::string& name, double ts, double dur, int corr, int stream = 7) {
  return fmt::format(R"({{"ph": "X", "cat": "kernel", "name": "{}", "pid": 0, "tid": {}, "ts": {}, "dur": {}, )"
                     R"("args": {{"stream": {}, "correlation": {}}}}})",
                     name, stream, ts, dur, stream, corr);
}

std::string launch(double ts, double dur, int corr) {
  return fmt::format(R"({{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, )"
                     R"("ts": {}, "dur": {}, "args": {{"correlation": {}}}}})",
                     ts, dur, corr);
}

// The figures that differ between the two trace sets (the synthetic ones are derived in
// tests/analysis/data/make_kineto_fixtures.py; the shared ones are HTA's, hta_anchor_values.json).
struct SetFigures {
  int64_t alexnet_hta_compute_ns, alexnet_hta_non_compute_ns;  // alexnet_single's temporal breakdown under kHta
  int64_t legacy_min_launches;                                   // legacy_2021's launch calls matched to kernels
};

class KinetoEdgeCases : public ::testing::TestWithParam<coc::test::TraceSet> {
 protected:
  std::string trace(const char* name) const { return coc::test::kineto_file(GetParam(), name); }
  const SetFigures& figures() const {
    static const SetFigures shared{10'630'000, 55'697'000, 1001}, synthetic{50'000, 45'000, 8};
    return GetParam().optional ? shared : synthetic;
  }
};

INSTANTIATE_TEST_SUITE_P(TraceSets, KinetoEdgeCases,
                         ::testing::Values(coc::test::synthetic_traces(), coc::test::shared_traces()),
                         coc::test::TraceSetName());

// 20. Sync records are neither compute nor communication.
TEST_P(KinetoEdgeCases, SyncEventsAreNeitherComputeNorComm_alexnet) {
  const std::string f = trace("alexnet_single");
  COC_REQUIRE_TRACE(GetParam(), f, "alexnet_single");
  AnalyzeOptions opt;
  opt.top_kernels = 1000;
  const RankReport r = one(f, Convention::kExact, opt);
  bool saw_sync = false;
  for (const KernelStat& k : r.top_kernels) saw_sync |= k.kind == "sync";
  EXPECT_TRUE(saw_sync);
  EXPECT_EQ(r.total.split.communication, 0);
  // HTA after the fix: compute is the kernels only (10630 µs on the real trace), the syncs land in non-compute time.
  const RankReport h = one(f, Convention::kHta);
  EXPECT_EQ(h.compute_time_ns, figures().alexnet_hta_compute_ns);
  EXPECT_EQ(h.non_compute_time_ns, figures().alexnet_hta_non_compute_ns);
}

// 21. Total and exposed communication are both reported.
TEST_P(KinetoEdgeCases, TotalAndExposedCommunication_nccl) {
  const std::string f = trace("nccl_2rank_rank0");
  COC_REQUIRE_TRACE(GetParam(), f, "nccl_2rank_rank0");
  const RankReport r = one(f);
  const auto& s = r.total.split;
  EXPECT_GT(s.communication, 0);
  EXPECT_GT(s.exposed, 0);
  EXPECT_LT(s.exposed, s.communication);
  EXPECT_EQ(s.overlapped + s.exposed, s.communication);
  EXPECT_EQ(s.computing + s.exposed + s.free, s.window);
  ASSERT_EQ(r.steps.size(), 3u);  // ProfilerStep#4..6, all kept by default
  EXPECT_EQ(r.steps[0].name, "ProfilerStep#4");
  for (const StepReport& s : r.steps) EXPECT_GT(s.split.communication, 0);
  const RankReport h = one(f, Convention::kHta);  // HTA drops the last step
  EXPECT_TRUE(h.hta_last_step_dropped);
  EXPECT_EQ(h.steps.size(), 2u);
}

// Host-bound evidence: idle gaps caused by late launches, launch-queue depth, kernels shorter than their launch.
TEST(TraceEdgeCases, HostBoundEvidence) {
  coc::test::TempDir d("coc_host");
  std::string ev;
  ev += launch(90, 5, 1) + ",\n" + kernel("A", 100, 10, 1) + ",\n";
  ev += launch(120, 5, 2) + ",\n" + kernel("B", 130, 10, 2) + ",\n";   // launched after the device went idle
  ev += launch(100, 5, 3) + ",\n" + kernel("C", 140, 10, 3) + ",\n";
  ev += launch(105, 20, 4) + ",\n" + kernel("D", 160, 10, 4);            // queued early: its gap is not the host's
  coc::test::write_file(d / "t.json", kineto_json(ev));
  const RankReport r = one(d / "t.json");
  EXPECT_EQ(r.total.kernels, 4);
  EXPECT_EQ(r.total.idle_gaps, 1);
  EXPECT_EQ(r.total.idle_gap_ns, 20'000);
  EXPECT_EQ(r.total.short_kernels, 1);
  EXPECT_DOUBLE_EQ(r.total.launch_queue_mean, 2.0);
  EXPECT_EQ(r.total.launch_queue_max, 3);
  EXPECT_EQ(r.launches, 4);
  EXPECT_EQ(r.launch_short_kernels, 1);
}

// 22 and 28. ns kept internally, never a negative duration; displayTimeUnit "ns" leaves ts in µs.
TEST_P(KinetoEdgeCases, NsResolutionNoNegativeDurations_ns_resolution) {
  const std::string f = trace("ns_resolution");
  COC_REQUIRE_TRACE(GetParam(), f, "ns_resolution");
  for (Convention c : {Convention::kExact, Convention::kHta, Convention::kAscend}) {
    const RankReport r = one(f, c);
    for (const StepReport& s : r.steps) {
      EXPECT_GE(s.split.computing, 0);
      EXPECT_GE(s.split.free, 0);
      EXPECT_GE(s.split.exposed, 0);
      EXPECT_EQ(s.split.computing + s.split.exposed + s.split.free, s.split.window);
    }
    EXPECT_GE(r.idle_time_ns, 0);
    EXPECT_GE(r.non_compute_time_ns, 0);
    // ts stays µs: the device span is ~385 ms, not ~385 µs.
    EXPECT_GT(r.kernel_time_ns, 300'000'000);
    EXPECT_LT(r.kernel_time_ns, 500'000'000);
  }
  const RankReport exact = one(f);
  EXPECT_NE(exact.kernel_time_ns % 1000, 0) << "exact convention keeps the ns digits";
}

TEST(TraceEdgeCases, NegativeDurationIsEmpty) {
  coc::test::TempDir d("coc_neg");
  coc::test::write_file(d / "t.json", kineto_json(kernel("k1", 100.5, 10, 1) + ",\n" + kernel("k2", 120, -3.5, 2)));
  const RankReport r = one(d / "t.json");
  EXPECT_EQ(r.total.split.computing, 10'000);
  EXPECT_EQ(r.total.split.window, 10'000);
}

// 23. Overlapping events on one stream: the union, never the sum.
TEST(TraceEdgeCases, OverlappingEventsOnOneStreamAreUnited) {
  coc::test::TempDir d("coc_union");
  coc::test::write_file(d / "t.json", kineto_json(kernel("a", 100.000, 10.5, 1) + ",\n" + kernel("b", 105.250, 10, 2) +
                                                  ",\n" + kernel("ncclKernel_AllReduce", 112, 20, 3)));
  const RankReport r = one(d / "t.json");
  EXPECT_EQ(r.total.split.computing, 15'250);  // [100, 115.25)
  EXPECT_EQ(r.total.split.communication, 20'000);
  EXPECT_EQ(r.total.split.overlapped, 3'250);
  EXPECT_EQ(r.total.split.window, 32'000);
}

// 24. Malformed strings are repaired or skipped, counted, reported; the rest of the file is analysed.
TEST(TraceEdgeCases, MalformedStringsAreCountedNotFatal) {
  coc::test::TempDir d("coc_malformed");
  std::string ev;
  ev += kernel("good_1", 100, 10, 1) + ",\n";
  ev += R"({"ph": "X", "cat": "kernel", "name": "ctrl)" "\x01" R"(char", "pid": 0, "tid": 7, "ts": 120, "dur": 5, "args": {"stream": 7, "correlation": 2}},)" "\n";
  ev += R"({"ph": "X", "cat": "kernel", "name": "C:\path\kernel", "pid": 0, "tid": 7, "ts": 130, "dur": 5, "args": {"stream": 7, "correlation": 3}},)" "\n";
  ev += R"({"ph": "X", "cat": "kernel", "name": "raw)" "\n" R"(newline", "pid": 0, "tid": 7, "ts": 140, "dur": 5, "args": {"stream": 7, "correlation": 4}},)" "\n";
  ev += R"({"ph": "X", "cat": "kernel", "name": "bad)" "\xff\xfe" R"(utf8", "pid": 0, "tid": 7, "ts": 150, "dur": 5, "args": {"stream": 7, "correlation": 5}},)" "\n";
  ev += R"({"ph": "X", "cat": "kernel", "name": "an "unescaped" quote", "pid": 0, "tid": 7, "ts": 160, "dur": 5, "args": {"stream": 7}},)" "\n";
  ev += kernel("good_2", 200, 10, 6);
  coc::test::write_file(d / "t.json", kineto_json(ev));
  AnalyzeOptions opt;
  opt.top_kernels = 100;
  const RankReport r = one(d / "t.json", Convention::kExact, opt);
  EXPECT_EQ(r.malformed_events, 5);
  EXPECT_TRUE(has_note(r, "malformed"));
  EXPECT_EQ(r.device_events, 6);  // the unescaped quote's event is skipped, the others repaired
  EXPECT_EQ(r.total.split.computing, 40'000);
  bool backslash_kept = false;
  for (const KernelStat& k : r.top_kernels) backslash_kept |= k.name == "C:\\path\\kernel";
  EXPECT_TRUE(backslash_kept);
}

// 25. ts: 0, dur: 0 events are flagged and kept out of the window.
TEST(TraceEdgeCases, ZeroTimestampEventsLeftOut) {
  coc::test::TempDir d("coc_zero");
  coc::test::write_file(d / "t.json", kineto_json(kernel("k", 1'000'000, 10, 1) + ",\n" + kernel("cupti_fault", 0, 0, 2)));
  const RankReport r = one(d / "t.json");
  EXPECT_EQ(r.zero_ts_events, 1);
  EXPECT_EQ(r.total.begin_ns, 1'000'000'000);
  EXPECT_EQ(r.total.split.window, 10'000);
  EXPECT_TRUE(has_note(r, "ts 0"));
}

// 26. Missing rank: distributedInfo.rank, else the user's mapping, else the file name; duplicates refused.
TEST_P(KinetoEdgeCases, MissingRank_rank_unavailable) {
  const std::string f = trace("rank_unavailable");
  COC_REQUIRE_TRACE(GetParam(), f, "rank_unavailable");
  const RankReport r = one(f);
  EXPECT_EQ(r.rank, -1);
  EXPECT_EQ(r.rank_source, "none");
  EXPECT_TRUE(has_note(r, "distributedInfo has no rank"));
  AnalyzeOptions opt;
  opt.rank_of_file[f] = 5;
  const RankReport m = one(f, Convention::kExact, opt);
  EXPECT_EQ(m.rank, 5);
  EXPECT_EQ(m.rank_source, "mapping");
}

TEST_P(KinetoEdgeCases, MissingRank_distributed_info_unavailable) {
  const std::string f = trace("distributed_info_unavailable");
  COC_REQUIRE_TRACE(GetParam(), f, "distributed_info_unavailable");
  const RankReport r = one(f);
  EXPECT_EQ(r.rank, -1);
  EXPECT_TRUE(has_note(r, "no distributedInfo"));
}

TEST(TraceEdgeCases, RankFromFileNameAndDuplicatesRefused) {
  coc::test::TempDir d("coc_ranks");
  const std::string body = kineto_json(kernel("k", 100, 10, 1));
  coc::test::write_file(d / "run_rank-3.json", body);
  EXPECT_EQ(one(d / "run_rank-3.json").rank, 3);
  EXPECT_EQ(one(d / "run_rank-3.json").rank_source, "file name");
  coc::test::write_file(d / "a.json", kineto_json(kernel("k", 100, 10, 1), R"("distributedInfo": {"rank": 1}, )"));
  coc::test::write_file(d / "b.json", kineto_json(kernel("k", 100, 10, 1), R"("distributedInfo": {"rank": 1}, )"));
  const coc::Error e = coc::test::expect_error([&] { analyze_paths({d / "a.json", d / "b.json"}, {}); });
  EXPECT_NE(std::string(e.what()).find("duplicate rank 1"), std::string::npos) << e.what();
}

// 27. No device events: under HTA's convention an explicit "no device activity" row, never a crash; under the
// exact convention a CPU-only PyTorch trace is analysed on its CPU operators (format torch-cpu; the figures are
// checked against the events in tests/cli/analyze_torch_cpu.sh).
TEST_P(KinetoEdgeCases, NoDeviceActivity_cpu_only_and_rank_non_gpu) {
  for (const char* name : {"cpu_only", "rank_non_gpu"}) {
    const std::string f = trace(name);
    COC_REQUIRE_TRACE(GetParam(), f, name);
    const RankReport h = one(f, Convention::kHta);
    EXPECT_FALSE(h.has_device_activity) << name;
    EXPECT_TRUE(has_note(h, "no device activity")) << name;
    EXPECT_EQ(h.total.split.window, 0) << name;
    const RankReport e = one(f, Convention::kExact);
    EXPECT_EQ(e.format, TraceFormat::kTorchCpu) << name;
    EXPECT_FALSE(has_note(e, "no device activity")) << name;
  }
  const RankReport cpu = one(trace("cpu_only"));
  EXPECT_EQ(cpu.rank, 34);
  ASSERT_EQ(cpu.steps.size(), 1u);
  EXPECT_EQ(cpu.steps[0].split.overlapped, 0);
  EXPECT_GT(cpu.steps[0].split.communication, 0);
}

// 29 and 30. Legacy 2021 traces: string tids "stream 7", capitalised categories, lowercase "external id".
TEST_P(KinetoEdgeCases, Legacy2021Format_legacy_2021) {
  const std::string f = trace("legacy_2021");
  COC_REQUIRE_TRACE(GetParam(), f, "legacy_2021");
  AnalyzeOptions opt;
  opt.top_kernels = 10000;
  const RankReport r = one(f, Convention::kExact, opt);
  EXPECT_TRUE(r.has_device_activity);
  EXPECT_EQ(r.rank, 0);  // "worker0" in the file name
  EXPECT_EQ(r.rank_source, "file name");
  EXPECT_EQ(r.steps.size(), 6u);
  EXPECT_GE(r.launches, figures().legacy_min_launches);  // Runtime launch calls matched to Kernel events by correlation
  ASSERT_FALSE(r.streams.empty());
  EXPECT_EQ(r.streams[0].stream, 7);
  bool memory = false, compute = false;
  for (const KernelStat& k : r.top_kernels) memory |= k.kind == "memory", compute |= k.kind == "compute";
  EXPECT_TRUE(memory);
  EXPECT_TRUE(compute);
  EXPECT_GT(r.total.split.computing, 0);
}

TEST(TraceEdgeCases, HugeIdsAndStringTids) {
  coc::test::TempDir d("coc_ids");
  const std::string ev =
      R"({"ph": "X", "cat": "Kernel", "name": "k", "pid": 12884901888, "tid": "stream 7", "ts": 100, "dur": 10, "args": {"stream": 7, "correlation": 9}},)"
      "\n"
      R"({"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 12884901888, "tid": 99999999999, "ts": 90, "dur": 5, "args": {"correlation": 9, "external id": 3}})";
  coc::test::write_file(d / "t.json", kineto_json(ev));
  const RankReport r = one(d / "t.json");
  EXPECT_EQ(r.launches, 1);
  ASSERT_EQ(r.streams.size(), 1u);
  EXPECT_EQ(r.streams[0].stream, 7);
  EXPECT_DOUBLE_EQ(r.launch_delay_mean_us, 5.0);
}

// 31 (format side). Ascend trace_view.json: array top level, string timestamps, pids above 2^32. The step starts
// 10 µs before its first device task and ends 15 µs after its last (a memcpy ending at 85 µs), as msprof's do:
// its "Overlap Analysis" lanes span only [10, 85) µs, so Free there is 10 µs, not the step's 35 µs. Under
// --convention ascend our split equals the lanes; under exact the window stays the whole ProfilerStep.
TEST(TraceEdgeCases, AscendTraceViewReproducesVendorLanes) {
  const std::string f = std::string(COC_TEST_DATA_DIR) + "/ascend_trace_view.json";
  for (Convention c : {Convention::kExact, Convention::kAscend}) {
    const RankReport r = one(f, c);
    EXPECT_EQ(r.format, TraceFormat::kAscend);
    ASSERT_TRUE(r.vendor_overlap_lanes.has_value());
    const auto& v = *r.vendor_overlap_lanes;
    const auto& s = r.total.split;
    EXPECT_EQ(s.computing, v.computing);
    EXPECT_EQ(s.communication, v.communication);
    EXPECT_EQ(s.exposed, v.exposed);
    EXPECT_EQ(s.overlapped, v.overlapped);
    EXPECT_EQ(s.computing, 50'000);
    EXPECT_EQ(s.exposed, 15'000);
    ASSERT_EQ(r.steps.size(), 1u);
    if (c == Convention::kAscend) {
      EXPECT_EQ(s.free, v.free);
      EXPECT_EQ(s.free, 10'000);
      EXPECT_EQ(s.window, 75'000);
      EXPECT_EQ(r.steps[0].split.window, 75'000);
      EXPECT_EQ(r.total.begin_ns, 1704161511400010204);  // the first device task, exact ns
    } else {
      EXPECT_EQ(s.window, 100'000);
      EXPECT_EQ(s.free, v.free + 25'000);  // the step's lead-in before the first task and its tail
      EXPECT_EQ(r.total.begin_ns, 1704161511400000204);  // "…400000.204" µs, exact ns
    }
  }
  // msprof counts the memcpy as Free: busy time (HTA figures) excludes it under kAscend only.
  EXPECT_EQ(one(f, Convention::kAscend).non_compute_time_ns + 3'000, one(f, Convention::kExact).non_compute_time_ns);
}

// Several steps under --convention ascend: each window is trimmed to its own device tasks and the total is their
// sum (the gap between two steps' trimmed windows belongs to no lane); a step without device tasks adds nothing.
TEST(TraceEdgeCases, AscendConventionTrimsEveryStepToItsDeviceTasks) {
  coc::test::TempDir d("ascend_steps");
  std::string t = R"([
{"name": "process_name", "pid": 1, "tid": 0, "ph": "M", "args": {"name": "Python"}},
{"name": "process_name", "pid": 2, "tid": 0, "ph": "M", "args": {"name": "Ascend Hardware"}},
{"name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": "1000.000", "dur": 100.0, "ph": "X"},
{"name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": "1100.000", "dur": 100.0, "ph": "X"},
{"name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": "1200.000", "dur": 100.0, "ph": "X"},
{"name": "A", "pid": 2, "tid": 2, "ts": "1020.000", "dur": 10.0, "ph": "X", "args": {"Task Type": "AI_CORE"}},
{"name": "B", "pid": 2, "tid": 2, "ts": "1040.000", "dur": 20.0, "ph": "X", "args": {"Task Type": "AI_CORE"}},
{"name": "C", "pid": 2, "tid": 2, "ts": "1150.000", "dur": 60.0, "ph": "X", "args": {"Task Type": "AI_CORE"}}
])";
  coc::test::write_file(d / "trace_view.json", t);
  const RankReport r = one(d / "trace_view.json", Convention::kAscend);
  ASSERT_EQ(r.steps.size(), 3u);
  EXPECT_EQ(r.steps[0].split.window, 40'000);  // [1020, 1060)
  EXPECT_EQ(r.steps[0].split.free, 10'000);
  EXPECT_EQ(r.steps[1].split.window, 50'000);  // [1150, 1200): C runs on past the step's end, clipped
  EXPECT_EQ(r.steps[2].split.window, 0);       // C started in step 2: step 3 has no task of its own
  EXPECT_EQ(r.total.split.window, 90'000);
  EXPECT_EQ(r.total.split.computing, 80'000);
  EXPECT_EQ(r.total.split.free, 10'000);
  const RankReport x = one(d / "trace_view.json", Convention::kExact);
  EXPECT_EQ(x.total.split.window, 300'000);  // exact keeps the ProfilerSteps
}

}  // namespace
