// The tracer (coc/runtime/tracer.h): nothing is recorded when off, levels filter sites, scopes record begin <= end
// with their args, two threads record into their own buffers without losing events, StepScope gates recording
// to the step, and intern() gives stable pointers. Single process.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "coc/core/error.h"
#include "coc/runtime/tracer.h"

namespace coc {
namespace {

using trace::Cat;
using trace::Level;

/// Each test starts and ends with the tracer off and empty (the tracer is process-wide).
class Tracer : public ::testing::Test {
 protected:
  void SetUp() override {
    trace::set_level(Level::kOff);
    trace::clear();
  }
  void TearDown() override {
    trace::set_level(Level::kOff);
    trace::clear();
  }
};

int64_t arg(const trace::Record& r, const char* key) {
  for (int i = 0; i < r.nargs; ++i)
    if (std::strcmp(r.args[i].key, key) == 0) return r.args[i].value;
  return -1;
}

TEST_F(Tracer, OffRecordsNothingAndEvaluatesNoArgs) {
  int evaluated = 0;
  auto count = [&] { return static_cast<int64_t>(++evaluated); };
  for (int i = 0; i < 100; ++i) {
    COC_TRACE_SCOPE(Cat::kCompute, Level::kLevel0, "gemm", {"m", count()});
  }
  EXPECT_EQ(evaluated, 0);
  EXPECT_TRUE(trace::collect().empty());
  EXPECT_FALSE(trace::enabled(Level::kLevel0));
  EXPECT_FALSE(trace::enabled(Level::kOff));
}

TEST_F(Tracer, LevelsFilterSites) {
  trace::set_level(Level::kLevel0);
  { COC_TRACE_SCOPE(Cat::kCompute, Level::kLevel0, "gemm"); }
  { COC_TRACE_SCOPE(Cat::kCompute, Level::kLevel1, "rmsnorm_forward"); }
  std::vector<trace::Record> r = trace::collect();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_STREQ(r[0].name, "gemm");
  trace::clear();
  trace::set_level(Level::kLevel1);
  { COC_TRACE_SCOPE(Cat::kCompute, Level::kLevel0, "gemm"); }
  { COC_TRACE_SCOPE(Cat::kCompute, Level::kLevel1, "rmsnorm_forward"); }
  EXPECT_EQ(trace::collect().size(), 2u);
}

TEST_F(Tracer, ScopeRecordsTimesArgsTrackAndContext) {
  trace::set_level(Level::kLevel1);
  const int64_t t0 = trace::now_ns();
  {
    trace::Context op("matmul_all_reduce");
    COC_TRACE_SCOPE(Cat::kCompute, Level::kLevel0, "gemm", {"m", 3}, {"k", 4}, {"n", 5}, {"flop", 120});
  }
  { COC_TRACE_SCOPE(Cat::kHost, Level::kLevel0, "forward"); }
  const int64_t t1 = trace::now_ns();
  std::vector<trace::Record> r = trace::collect();
  ASSERT_EQ(r.size(), 2u);
  std::sort(r.begin(), r.end(), [](auto& a, auto& b) { return a.begin_ns < b.begin_ns; });
  EXPECT_LE(t0, r[0].begin_ns);
  EXPECT_LE(r[0].begin_ns, r[0].end_ns);
  EXPECT_LE(r[1].end_ns, t1);
  EXPECT_EQ(r[0].track, trace::Track::kCompute);
  EXPECT_EQ(r[1].track, trace::Track::kHost);
  EXPECT_EQ(arg(r[0], "m"), 3);
  EXPECT_EQ(arg(r[0], "flop"), 120);
  EXPECT_STREQ(r[0].context, "matmul_all_reduce");
  EXPECT_EQ(r[1].context, nullptr);  // the context ended with its scope
}

TEST_F(Tracer, ExplicitRecordTruncatesLongLabels) {
  trace::set_level(Level::kLevel0);
  trace::Record rec;
  rec.cat = Cat::kComm;
  rec.track = trace::Track::kComm;
  rec.name = "all_reduce";
  rec.begin_ns = 10;
  rec.end_ns = 20;
  rec.set_label("tag", std::string(200, 'x'));
  trace::record(Level::kLevel0, rec);
  trace::record(Level::kLevel1, rec);  // above the level: dropped
  std::vector<trace::Record> r = trace::collect();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(std::strlen(r[0].label), static_cast<size_t>(trace::Record::kLabelBytes - 1));
  EXPECT_STREQ(r[0].label_key, "tag");
}

TEST_F(Tracer, TwoThreadsRecordIntoTheirOwnBuffers) {
  trace::set_level(Level::kLevel0);
  constexpr int kPerThread = 10000;  // more than one buffer block per thread
  auto work = [](const char* name) {
    for (int i = 0; i < kPerThread; ++i) {
      COC_TRACE_SCOPE(Cat::kCompute, Level::kLevel0, name, {"i", i});
    }
  };
  std::thread a(work, "a"), b(work, "b");
  a.join();
  b.join();  // the threads are gone: their buffers must survive them
  uint64_t dropped = 1;
  std::vector<trace::Record> r = trace::collect(&dropped);
  EXPECT_EQ(dropped, 0u);
  ASSERT_EQ(r.size(), 2u * kPerThread);
  for (const char* name : {"a", "b"}) {
    std::vector<int64_t> seen;
    for (const auto& x : r)
      if (std::strcmp(x.name, name) == 0) seen.push_back(arg(x, "i"));
    ASSERT_EQ(seen.size(), static_cast<size_t>(kPerThread)) << name;
    // One thread's events stay in its order: no event was lost or overwritten by the other thread.
    for (int i = 0; i < kPerThread; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)], i) << name;
  }
}

TEST_F(Tracer, StepScopeRecordsOnlyInsideTheStep) {
  { COC_TRACE_SCOPE(Cat::kHost, Level::kLevel0, "before"); }
  {
    trace::StepScope step(Level::kLevel1, 7);
    { COC_TRACE_SCOPE(Cat::kHost, Level::kLevel0, "forward"); }
    step.finish();
    { COC_TRACE_SCOPE(Cat::kHost, Level::kLevel0, "after finish"); }
  }
  {
    trace::StepScope off(Level::kOff, 8);  // an unprofiled step records nothing
    { COC_TRACE_SCOPE(Cat::kHost, Level::kLevel0, "unprofiled"); }
  }
  std::vector<trace::Record> r = trace::collect();
  ASSERT_EQ(r.size(), 2u);
  std::sort(r.begin(), r.end(), [](auto& a, auto& b) { return a.begin_ns < b.begin_ns; });
  EXPECT_EQ(r[0].cat, Cat::kStep);
  EXPECT_EQ(arg(r[0], "iteration"), 7);
  EXPECT_STREQ(r[1].name, "forward");
  EXPECT_LE(r[0].begin_ns, r[1].begin_ns);
  EXPECT_GE(r[0].end_ns, r[1].end_ns);
  EXPECT_EQ(trace::level(), Level::kOff);
}

TEST_F(Tracer, ConsecutiveStepsTileTheTimeLine) {
  { trace::StepScope a(Level::kLevel0, 100); }
  { trace::StepScope b(Level::kLevel0, 101); }  // directly follows 100: begins where it ended
  { trace::StepScope c(Level::kLevel0, 103); }  // 102 was not profiled: a fresh start
  std::vector<trace::Record> r = trace::collect();
  ASSERT_EQ(r.size(), 3u);
  std::sort(r.begin(), r.end(), [](auto& x, auto& y) { return arg(x, "iteration") < arg(y, "iteration"); });
  EXPECT_EQ(r[1].begin_ns, r[0].end_ns);
  EXPECT_GE(r[2].begin_ns, r[1].end_ns);
  for (const auto& s : r) EXPECT_LE(s.begin_ns, s.end_ns);
}

TEST_F(Tracer, InternGivesOneStablePointerPerString) {
  std::string a = "tp", b = "t";
  b += "p";
  const char* p = trace::intern(a);
  EXPECT_EQ(p, trace::intern(b));
  EXPECT_STREQ(p, "tp");
  const char* q = nullptr;
  std::thread t([&] { q = trace::intern("tp"); });
  t.join();
  EXPECT_EQ(p, q);
  EXPECT_NE(p, trace::intern("dp"));
}

TEST_F(Tracer, ParseLevelNamesTheFlag) {
  EXPECT_EQ(trace::parse_level("level0"), Level::kLevel0);
  EXPECT_EQ(trace::parse_level("level1"), Level::kLevel1);
  try {
    trace::parse_level("level2");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("--profile-level"), std::string::npos);
  }
}

}  // namespace
}  // namespace coc
