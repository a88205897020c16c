// coc-test-np: 1 2
// The progress interface (coc/comm/progress.h) on real MPI ranks: progress() completes an op the caller never
// waits for, progress_during and lend_progress move ops while the caller makes no MPI call, and each says what the
// engine needs (no thread with nothing in flight or with the threaded engine).
#include "coc/comm/progress.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "coc/comm/communicator.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

using namespace std::chrono_literals;
using test::world_size;

/// Sleeps (no MPI call from this thread) until `c`'s engine has nothing in flight, 20 s at most.
void sleep_until_idle(const Communicator& c) {
  const auto t0 = std::chrono::steady_clock::now();
  while (c.engine()->in_flight() > 0 && std::chrono::steady_clock::now() - t0 < 20s) std::this_thread::sleep_for(5ms);
}

TEST(Progress, TurnsCompleteAnInlineOpWithoutAWait) {
  auto c = test::world_comm(EngineKind::kInline);
  std::vector<float> x(1 << 12, 1.0f);
  c->barrier("start");
  Work w = c->all_reduce(x.data(), static_cast<int64_t>(x.size()), ReduceOp::kSum, "turns");
  const auto t0 = std::chrono::steady_clock::now();
  while (c->engine()->in_flight() > 0 && std::chrono::steady_clock::now() - t0 < 20s) progress(*c);
  EXPECT_EQ(c->engine()->in_flight(), 0u) << "progress() did not complete the all-reduce";
  w.wait();
  EXPECT_EQ(x[0], static_cast<float>(world_size()));
  c->barrier("end");
}

TEST(Progress, DuringMovesOpsWhileTheComputeMakesNoMpiCall) {
  auto c = test::world_comm(EngineKind::kInline);
  std::vector<float> x(1 << 16, 1.0f);
  c->barrier("start");
  Work w = c->all_reduce(x.data(), static_cast<int64_t>(x.size()), ReduceOp::kSum, "during");
  int runs = 0;
  progress_during(*c, [&] {
    ++runs;
    sleep_until_idle(*c);
  });
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(c->engine()->in_flight(), 0u) << "the lent thread did not complete the all-reduce";
  w.wait();
  EXPECT_EQ(x[0], static_cast<float>(world_size()));
  // The compute's own exception propagates, with or without ops in flight.
  EXPECT_THROW(progress_during(*c, [] { throw std::runtime_error("compute failed"); }), std::runtime_error);
  c->barrier("end");
}

TEST(Progress, LeaseOnlyWhereTheEngineNeedsOne) {
  auto c = test::world_comm(EngineKind::kInline);
  EXPECT_FALSE(progresses_in_background(*c));
  EXPECT_EQ(lend_progress(*c), nullptr);  // nothing in flight: no thread lent
  std::vector<float> x(1 << 12, 1.0f);
  c->barrier("start");
  Work w = c->all_reduce(x.data(), static_cast<int64_t>(x.size()), ReduceOp::kSum, "leased");
  {
    const std::unique_ptr<ProgressLease> lease = lend_progress(*c);
    if (c->engine()->in_flight() > 0) EXPECT_NE(lease, nullptr);  // the op may have completed at once (np 1)
    sleep_until_idle(*c);
    EXPECT_EQ(c->engine()->in_flight(), 0u);
  }
  w.wait();
  auto t = test::world_comm(EngineKind::kThread);
  EXPECT_TRUE(progresses_in_background(*t));
  Work u = t->all_reduce(x.data(), 1, ReduceOp::kSum, "threaded");
  EXPECT_EQ(lend_progress(*t), nullptr);  // the threaded engine drives MPI itself
  u.wait();
  c->barrier("end");
}

}  // namespace
}  // namespace coc
