// coc-test-np: 1 2
// WaitFiller (coc/comm/wait_filler.h): a wait for an op that is not done runs the filler's units until the op
// completes or the filler has nothing left, with either progress engine; a unit's own waits run no unit; the inner
// of two fillers serves, and the outer again once the inner is gone.
#include "coc/comm/wait_filler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "coc/comm/communicator.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

using namespace std::chrono_literals;
using test::world_rank;
using test::world_size;

/// Rank 0 posts an all-reduce at once and waits for it with `unit` as its filler; the other ranks post theirs
/// 100 ms later, so rank 0's wait finds it not done. Returns the units rank 0 ran (0 on the other ranks).
int fill_one_wait(EngineKind kind, int limit) {
  auto c = test::world_comm(kind);
  std::vector<float> x(256, 1.0f);
  c->barrier("start");
  int units = 0;
  if (c->rank() != 0) std::this_thread::sleep_for(100ms);
  Work w = c->all_reduce(x.data(), static_cast<int64_t>(x.size()), ReduceOp::kSum, "filled");
  if (c->rank() == 0) {
    const WaitFiller f([&] {
      std::this_thread::sleep_for(1ms);
      return ++units < limit;
    });
    w.wait();
  } else {
    w.wait();
  }
  EXPECT_EQ(x[0], static_cast<float>(world_size()));
  c->barrier("end");
  return units;
}

TEST(WaitFiller, FillsAWaitUntilTheOpCompletes) {
  if (world_size() < 2) GTEST_SKIP() << "needs a peer that posts late";
  for (EngineKind kind : {EngineKind::kInline, EngineKind::kThread}) {
    const int units = fill_one_wait(kind, 1 << 30);
    if (world_rank() == 0) {
      EXPECT_GT(units, 10) << to_string(kind) << ": the 100 ms wait ran few units";
      EXPECT_LT(units, 5000) << to_string(kind) << ": the units went on after the op completed";
    }
  }
}

TEST(WaitFiller, StopsWhenTheFillerHasNothingLeft) {
  if (world_size() < 2) GTEST_SKIP() << "needs a peer that posts late";
  for (EngineKind kind : {EngineKind::kInline, EngineKind::kThread})
    if (const int units = fill_one_wait(kind, 3); world_rank() == 0) EXPECT_EQ(units, 3);
}

TEST(WaitFiller, RunsTheInnermostFillerAndNoneInsideAUnit) {
  EXPECT_FALSE(WaitFiller::run_unit());  // none installed
  int outer = 0, inner = 0;
  bool nested_ran = true;
  const WaitFiller a([&] {
    ++outer;
    nested_ran = WaitFiller::run_unit();  // a wait inside a unit runs no unit
    return true;
  });
  {
    const WaitFiller b([&] { return ++inner < 2; });
    EXPECT_TRUE(WaitFiller::run_unit());
    EXPECT_FALSE(WaitFiller::run_unit());  // b's second unit says nothing is left
    EXPECT_FALSE(WaitFiller::run_unit());  // b is exhausted; a stays hidden while b lives
    EXPECT_EQ(inner, 2);
    EXPECT_EQ(outer, 0);
  }
  EXPECT_TRUE(WaitFiller::run_unit());
  EXPECT_EQ(outer, 1);
  EXPECT_FALSE(nested_ran);
}

}  // namespace
}  // namespace coc
