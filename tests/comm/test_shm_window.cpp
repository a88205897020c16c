// coc-test-np: 1 2 4
// coc-test-timeout: 120
//
// ShmWindow (coc/comm/shm_window.h) on real ranks: every rank of one node is node-local; segments are directly
// readable by the peers; growth on demand keeps the data and flag contract (generations, never reset); a flag that
// never comes ends in kTimeout within the deadline instead of a hang; a window bigger than /dev/shm is refused up
// front with a uniform error that names the size and the fix (edge case 17 of docs/edge-cases.md).
#include <gtest/gtest.h>

#include "coc/comm/shm_window.h"
#include "coc/core/error.h"
#include "support/expect_error.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

TEST(ShmWindow, PeersSeeEachOthersTilesThroughFlags) {
  auto comm = test::world_comm();
  ShmWindow& win = comm->shm_window();
  ASSERT_TRUE(win.node_local());
  ASSERT_TRUE(win.usable()) << win.unavailable_reason();
  const int T = comm->size(), me = comm->rank();
  for (int call = 0; call < 50; ++call) {
    // Growing sizes, so the window is reallocated a few times along the way (power-of-two growth).
    const int64_t elems = 1000 + call * 5000;
    ASSERT_TRUE(win.ensure(4, elems * 4, "test"));
    const uint64_t gen = win.begin_op("test");
    float* mine = win.data(me);
    for (int64_t i = 0; i < elems; ++i) mine[i] = static_cast<float>(me * 1000003 + call * 7 + i % 97);
    win.set_flag(1, gen);
    for (int r = 0; r < T; ++r) {
      win.wait_flag(r, 1, gen, "test tile");
      const float* p = win.data(r);
      int64_t bad = 0;
      for (int64_t i = 0; i < elems; ++i) bad += p[i] != static_cast<float>(r * 1000003 + call * 7 + i % 97);
      EXPECT_EQ(bad, 0) << "call " << call << " rank " << r;
    }
    win.end_op(gen);
  }
  EXPECT_LE(win.allocations(), 12) << "growth must be geometric, not per call";
}

TEST(ShmWindow, MissingFlagTimesOutWithClearError) {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(300);
  Communicator comm(MPI_COMM_WORLD, "short", std::make_shared<ProgressEngine>(EngineKind::kInline, 100), o);
  if (comm.size() == 1) GTEST_SKIP() << "needs a peer";
  ShmWindow& win = comm.shm_window();
  ASSERT_TRUE(win.ensure(2, 64, "test"));
  const uint64_t gen = win.begin_op("test");
  // Nobody ever sets flag 2 for this generation: every rank must give up after its own deadline.
  const auto t0 = std::chrono::steady_clock::now();
  Error e = test::expect_error([&] { win.wait_flag((comm.rank() + 1) % comm.size(), 2, gen, "tile 2 of a test"); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
  EXPECT_FALSE(e.uniform());
  EXPECT_NE(std::string(e.what()).find("tile 2 of a test"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("dead, stuck"), std::string::npos) << e.what();
  EXPECT_LT(s, 30.0);  // generous: a hang is what this guards against, not speed
  win.end_op(gen);
  comm.barrier("after timeout test");
}

TEST(ShmWindow, TooLargeForDevShmIsRefusedUpFront) {
  auto comm = test::world_comm();
  ShmWindow& win = comm->shm_window();
  // 2^50 bytes per rank: far beyond any /dev/shm. Refused by the statvfs check before MPI allocates anything.
  Error e = test::expect_error([&] { win.ensure(1, int64_t{1} << 50, "a huge test op"); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(e.uniform());
  const std::string msg = e.what();
  EXPECT_NE(msg.find("/dev/shm"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--shm-size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("a huge test op"), std::string::npos) << msg;
  // The window still works afterwards.
  ASSERT_TRUE(win.ensure(1, 1024, "test"));
  const uint64_t gen = win.begin_op("test");
  win.set_flag(1, gen);
  for (int r = 0; r < comm->size(); ++r) win.wait_flag(r, 1, gen, "test");
  win.end_op(gen);
}

}  // namespace
}  // namespace coc
