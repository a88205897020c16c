// Streams and events: the CPU analogue of CUDA streams and events.
//
// A Stream is an ordered task queue served by its own thread. Tasks run one at a time, in the order they were
// enqueued, so work on one stream needs no locking against itself; work on different streams runs concurrently
// (on a 2-core machine, a GEMM stream and a communication stream). The thread sleeps on a condition variable
// while the queue is empty: an idle stream never takes CPU from the GEMM (docs/design.md, async model).
//
// An Event marks a point in a stream: record(s) places a marker after everything enqueued on `s` so far, and the
// event completes when the stream reaches it. Other threads wait on it (with a deadline) or query it; another
// stream orders itself after it with wait_event(), exactly like cudaStreamWaitEvent.
//
// Errors: a task that throws puts its stream in an error state. Later user tasks on that stream are skipped
// (they would read the failed task's output, as CUDA's sticky errors prevent), while event markers and
// wait_event barriers still run so that no other stream or thread waits forever. synchronize() rethrows the
// first error and clears the state.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace coc {

class Stream;

/// A marker recorded on a stream. Copies share state (like a cudaEvent_t handle). An event that was never
/// recorded counts as complete, as in CUDA. Recording again re-arms it: completion then refers to the newest
/// record. Thread-safe.
class Event {
 public:
  Event();

  /// Marks the point after every task enqueued on `stream` so far; the event completes when the stream has run
  /// them all (whether or not they threw).
  void record(Stream& stream);
  /// True when the newest record has been reached (or there was none). Never blocks.
  bool query() const;
  /// Blocks until query() is true or `deadline` passes; returns false on expiry. The caller decides whether
  /// expiry is an error (so a timeout can name the op it was waiting for).
  bool wait_until(std::chrono::steady_clock::time_point deadline) const;
  /// wait_until(now + timeout).
  bool wait_for(std::chrono::nanoseconds timeout) const;

 private:
  friend class Stream;
  struct State {
    mutable std::mutex mu;
    mutable std::condition_variable cv;
    uint64_t recorded = 0;   ///< generation of the newest record()
    uint64_t completed = 0;  ///< highest generation the stream has reached
  };
  std::shared_ptr<State> state_;
};

/// An ordered task queue on its own thread. Not copyable or movable (its thread holds `this`).
class Stream {
 public:
  /// `name` labels the stream in errors (and later in traces), e.g. "compute", "comm".
  explicit Stream(std::string name = "stream");
  /// Runs every task still queued, then joins the thread. An error not yet collected by synchronize() is
  /// dropped (destructors must not throw).
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  /// Appends `task`; it runs after every task enqueued before it. Never blocks on the task. May be called from
  /// any thread, including from a task on this stream. Throws kInternal if `task` is empty.
  void enqueue(std::function<void()> task);
  /// Blocks until every task enqueued before this call has finished, then rethrows the first exception any of
  /// them threw since the last synchronize() (and clears it). Throws kInternal when called from this stream's
  /// own thread, which would deadlock.
  void synchronize();
  /// Makes later tasks on this stream wait until `event`'s newest record (as of this call) completes. Does not
  /// block the caller. Waiting on an unrecorded event is a no-op.
  void wait_event(const Event& event);
  /// True when no task is queued or running.
  bool idle() const;
  const std::string& name() const { return name_; }

 private:
  friend class Event;
  struct Task {
    std::function<void()> fn;
    bool internal = false;  ///< event marker or wait: runs even after an error
  };
  void push(Task t);
  void thread_main();

  std::string name_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  ///< the stream thread waits here for tasks
  std::condition_variable done_cv_;  ///< synchronize() waits here for progress
  std::deque<Task> queue_;
  uint64_t enqueued_ = 0;   ///< tasks ever enqueued
  uint64_t finished_ = 0;   ///< tasks ever finished (run, skipped or failed)
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace coc
