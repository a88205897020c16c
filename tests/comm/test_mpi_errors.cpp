// coc-test-np: 2
// MPI's errors reach coc's error path (Communicator's constructor sets MPI_ERRORS_RETURN): a receive shorter than
// its message (MPI_ERR_TRUNCATE, what ranks that disagree on a size meet) fails that op's wait with one kComm error
// naming the op and MPI's reason, with either engine, also when the communication thread saw it first; the job is
// neither aborted by MPI's own handler (which launchers may silence) nor left waiting for the deadline.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "coc/core/error.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

using namespace std::chrono_literals;
using test::world_rank;
using test::world_size;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

/// Rank 0 sends 8 floats, rank 1 receives 4: rank 1's wait must throw kComm (after `delay`, so that the threaded
/// engine's thread tests the op first). Returns rank 1's message ("" on rank 0, whose send completes).
std::string truncated_receive(EngineKind kind, std::chrono::milliseconds delay) {
  auto c = test::world_comm(kind, 20000);
  std::vector<float> send(8, 1.0f), recv(4, 0.0f);
  c->barrier("start");
  std::string message;
  if (c->rank() == 0) {
    const P2pSend s{.peer = 1, .buf = send.data(), .count = 8};
    c->exchange({&s, 1}, {}, "too_long").wait();
  } else {
    const P2pRecv r{.peer = 0, .buf = recv.data(), .count = 4};
    Work w = c->exchange({}, {&r, 1}, "too_short");
    std::this_thread::sleep_for(delay);
    const auto start = std::chrono::steady_clock::now();
    try {
      w.wait();
      ADD_FAILURE() << to_string(kind) << ": a truncated receive completed";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kComm);
      message = e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "the wait ran towards its deadline";
    // A second wait reports the same failure, it does not hang.
    EXPECT_THROW(w.wait(), Error);
  }
  c->barrier("end");  // a failed receive leaves the communicator usable
  return message;
}

TEST(MpiErrors, ATruncatedReceiveFailsItsWaitWithOneLine) {
  if (world_size() != 2) GTEST_SKIP() << "two ranks";
  for (EngineKind kind : {EngineKind::kInline, EngineKind::kThread})
    for (auto delay : {0ms, 50ms}) {
      const std::string m = truncated_receive(kind, delay);
      if (world_rank() != 1) continue;
      SCOPED_TRACE(to_string(kind));
      EXPECT_NE(m.find("MPI failure in"), std::string::npos) << m;
      EXPECT_NE(m.find("too_short"), std::string::npos) << "the op's tag: " << m;
      EXPECT_NE(lower(m).find("truncat"), std::string::npos) << "MPI's reason: " << m;
      EXPECT_NE(m.find("--debug-collectives"), std::string::npos) << "the way to find the disagreement: " << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << "one line: " << m;
    }
}

}  // namespace
}  // namespace coc
