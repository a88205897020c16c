// Streams and events (coc/runtime/stream.h): ordering, synchronize, sticky errors, cross-stream ordering through
// events, deadlines, and that an idle stream sleeps. Single process (no MPI ranks needed), but linked with the
// MPI test main like every test.
#include <gtest/gtest.h>
#include <pthread.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "coc/core/error.h"
#include "coc/runtime/stream.h"

namespace coc {
namespace {

using namespace std::chrono_literals;

/// CPU time consumed so far by the thread whose CPU clock is `c`, in ms.
double thread_cpu_ms(clockid_t c) {
  timespec ts{};
  clock_gettime(c, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

TEST(Stream, RunsTasksInEnqueueOrder) {
  Stream s("order");
  std::vector<int> seen;  // touched only by the stream thread until synchronize()
  for (int i = 0; i < 1000; ++i) s.enqueue([&seen, i] { seen.push_back(i); });
  s.synchronize();
  ASSERT_EQ(seen.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], i);
  EXPECT_TRUE(s.idle());
}

TEST(Stream, SynchronizeWaitsForSlowTask) {
  Stream s;
  std::atomic<bool> done{false};
  s.enqueue([&] {
    std::this_thread::sleep_for(50ms);
    done.store(true);
  });
  EXPECT_FALSE(done.load());  // enqueue never blocks on the task
  s.synchronize();
  EXPECT_TRUE(done.load());
}

TEST(Stream, TaskExceptionIsRethrownAtSynchronizeAndLaterTasksAreSkipped) {
  Stream s("failing");
  std::atomic<int> ran{0};
  s.enqueue([&] { ++ran; });
  s.enqueue([] { throw Error(ErrorKind::kIo, "disk on fire"); });
  s.enqueue([&] { ran += 100; });  // would read the failed task's output: skipped
  try {
    s.synchronize();
    FAIL() << "synchronize() should rethrow";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_STREQ(e.what(), "disk on fire");
  }
  EXPECT_EQ(ran.load(), 1);
  // The error is cleared: the stream is usable again.
  s.enqueue([&] { ran += 10; });
  EXPECT_NO_THROW(s.synchronize());
  EXPECT_EQ(ran.load(), 11);
}

TEST(Stream, OnlyTheFirstErrorIsReported) {
  Stream s;
  s.enqueue([] { throw std::runtime_error("first"); });
  s.enqueue([] { throw std::runtime_error("second"); });
  EXPECT_THROW(
      {
        try {
          s.synchronize();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "first");
          throw;
        }
      },
      std::runtime_error);
}

TEST(Stream, SynchronizeFromOwnTaskIsRefusedInsteadOfDeadlocking) {
  Stream s("self");
  s.enqueue([&] { s.synchronize(); });
  EXPECT_THROW(s.synchronize(), Error);
}

TEST(Stream, EmptyTaskIsRejected) {
  Stream s;
  EXPECT_THROW(s.enqueue(std::function<void()>()), Error);
}

TEST(Stream, DestructorDrainsQueuedTasks) {
  std::atomic<int> ran{0};
  {
    Stream s;
    for (int i = 0; i < 10; ++i)
      s.enqueue([&] {
        std::this_thread::sleep_for(1ms);
        ++ran;
      });
  }
  EXPECT_EQ(ran.load(), 10);
}

TEST(Stream, TaskMayEnqueueOnItsOwnStream) {
  Stream s;
  std::vector<int> seen;
  std::atomic<bool> gate{false};
  // Hold the stream until both outer tasks are queued, so the nested task is certainly queued after task 2.
  s.enqueue([&] {
    while (!gate.load()) std::this_thread::sleep_for(1ms);
  });
  s.enqueue([&] {
    seen.push_back(1);
    s.enqueue([&] { seen.push_back(3); });
  });
  s.enqueue([&] { seen.push_back(2); });
  gate.store(true);
  // The first synchronize() may fix its target before the nested task exists; the second covers it.
  s.synchronize();
  s.synchronize();
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 3}));
}

TEST(Event, UnrecordedEventIsComplete) {
  Event e;
  EXPECT_TRUE(e.query());
  EXPECT_TRUE(e.wait_for(0ms));
}

TEST(Event, CompletesWhenStreamReachesIt) {
  Stream s;
  std::atomic<bool> release{false};
  s.enqueue([&] {
    while (!release.load()) std::this_thread::sleep_for(1ms);
  });
  Event e;
  e.record(s);
  EXPECT_FALSE(e.query());
  // Deadline expiry returns false (and takes about the deadline, not forever).
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(e.wait_for(30ms));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 30ms);
  release.store(true);
  EXPECT_TRUE(e.wait_until(std::chrono::steady_clock::now() + 10s));
  EXPECT_TRUE(e.query());
  s.synchronize();
}

TEST(Event, RecordAgainRearms) {
  Stream s;
  Event e;
  e.record(s);
  s.synchronize();
  EXPECT_TRUE(e.query());
  std::atomic<bool> release{false};
  s.enqueue([&] {
    while (!release.load()) std::this_thread::sleep_for(1ms);
  });
  e.record(s);
  EXPECT_FALSE(e.query());  // refers to the newest record now
  release.store(true);
  EXPECT_TRUE(e.wait_for(10s));
}

TEST(Event, CompletesEvenIfAnEarlierTaskThrew) {
  // No waiter may hang because a stream failed; the error is reported by synchronize().
  Stream s;
  s.enqueue([] { throw std::runtime_error("boom"); });
  Event e;
  e.record(s);
  EXPECT_TRUE(e.wait_for(10s));
  EXPECT_THROW(s.synchronize(), std::runtime_error);
}

TEST(Event, WaitEventOrdersAcrossStreams) {
  // Producer writes after a delay; the consumer stream must not read before the producer's event.
  for (int rep = 0; rep < 20; ++rep) {
    Stream producer("producer"), consumer("consumer");
    int value = 0;  // written by producer, read by consumer: the event is the only synchronisation
    int seen = -1;
    producer.enqueue([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(rep % 3));
      value = 42;
    });
    Event ready;
    ready.record(producer);
    consumer.wait_event(ready);
    consumer.enqueue([&] { seen = value; });
    consumer.synchronize();
    EXPECT_EQ(seen, 42) << "rep " << rep;
    producer.synchronize();
  }
}

TEST(Event, WaitEventUsesRecordCurrentAtCallTime) {
  // Re-recording after wait_event must not make the waiting stream wait for the newer record (CUDA semantics).
  Stream a("a"), b("b");
  Event e;
  e.record(a);
  a.synchronize();
  b.wait_event(e);  // already complete: b must not block
  std::atomic<bool> release{false};
  a.enqueue([&] {
    while (!release.load()) std::this_thread::sleep_for(1ms);
  });
  e.record(a);  // newer record, not reached yet
  std::atomic<bool> b_ran{false};
  b.enqueue([&] { b_ran.store(true); });
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!b_ran.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(b_ran.load());
  release.store(true);
  a.synchronize();
  b.synchronize();
}

TEST(Event, WaitOnUnrecordedEventIsNoop) {
  Stream s;
  Event e;
  s.wait_event(e);
  bool ran = false;
  s.enqueue([&] { ran = true; });
  s.synchronize();
  EXPECT_TRUE(ran);
}

TEST(Stream, IdleStreamsDoNotBurnCpu) {
  // An idle stream thread must sleep (docs/design.md: never busy-spin a core the GEMM needs). Measured per
  // stream thread, not per process: OpenBLAS's own worker spins with sched_yield for a while after it starts,
  // which would blame the streams for it. Each stream reports its thread's CPU clock from inside a task.
  Stream a("idle a"), b("idle b");
  clockid_t ca{}, cb{};
  a.enqueue([&] { pthread_getcpuclockid(pthread_self(), &ca); });
  b.enqueue([&] { pthread_getcpuclockid(pthread_self(), &cb); });
  a.synchronize();
  b.synchronize();
  const double before = thread_cpu_ms(ca) + thread_cpu_ms(cb);
  std::this_thread::sleep_for(300ms);
  const double used = thread_cpu_ms(ca) + thread_cpu_ms(cb) - before;
  EXPECT_LT(used, 20.0) << "two idle streams used " << used << " ms of CPU in 300 ms";
}

}  // namespace
}  // namespace coc
