// Work: the handle of one asynchronous collective, in the style of PyTorch c10d's Work objects.
//
// A Work is created by a Communicator's i* call and completes when its MPI request does. `wait()` blocks the
// caller until then or until the deadline; on expiry it throws a kTimeout error that names the op, its sequence
// number and byte count, and dumps the flight recorder (the last ops on this rank), so that a stuck job says
// which collective it is stuck in. A Work may carry a completion step (for example the fixed-order local sum of
// the deterministic all-reduce) that runs on the waiting thread, once, after the MPI request finished.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace coc {

class ProgressEngine;

/// What a Work is doing; kept in the flight recorder and printed on errors.
struct OpDesc {
  std::string comm;        ///< communicator name ("tp", "dp", "world")
  std::string op;          ///< "all_reduce", "reduce_scatter", ...
  std::string tag;         ///< caller's label, e.g. "row_fwd chunk 2/4 [1024, 4096]"
  uint64_t seq = 0;        ///< per-communicator sequence number, identical across ranks for the same op
  int64_t bytes = 0;       ///< bytes this rank contributes
  std::string to_string() const;
};

/// Shared state of one in-flight op. Internal to comm/; users hold a Work.
struct WorkState {
  OpDesc desc;
  std::vector<MPI_Request> requests;
  std::atomic<bool> done{false};
  std::chrono::steady_clock::time_point start, end;
  std::function<void()> on_complete;  ///< runs once on the waiting thread after `done`
  std::vector<std::shared_ptr<void>> keep_alive;  ///< buffers MPI may read until completion (counts arrays)
  bool completed_callback = false;
  /// Point-to-point exchanges (Communicator::exchange): requests[sends_from, end) are the sends, and sends_done
  /// turns true once they have completed locally (the data has left this rank's buffers), possibly before the
  /// receives. `deferred` posts the sends later: the engine runs it, under its MPI mutex, once `after`'s sends are
  /// done; both are cleared then.
  size_t sends_from = SIZE_MAX;
  std::atomic<bool> sends_done{false};
  std::function<void(std::vector<MPI_Request>&)> deferred;
  std::shared_ptr<WorkState> after;
  int mpi_tag = -1;  ///< the MPI tag of an exchange's messages (Communicator::exchange_sends reuses it)
  std::mutex mu;                       ///< guards cv waits in the threaded engine
  std::condition_variable cv;
};

/// Records `w` (post → completion detected, with op, bytes, seq, communicator and tag) as a "comm" trace event
/// when tracing is on (runtime/tracer.h, docs/profiling.md). Called by the progress engine once per op.
void trace_completed(const WorkState& w);

/// Handle to an asynchronous collective. Default-constructed Work is already complete.
class Work {
 public:
  Work() = default;
  Work(std::shared_ptr<WorkState> state, std::shared_ptr<ProgressEngine> engine, std::chrono::milliseconds timeout)
      : state_(std::move(state)), engine_(std::move(engine)), timeout_(timeout) {}

  /// Non-blocking: advances progress once and returns true when the op (and its completion step) is done.
  bool test();
  /// Blocks until done. Throws Error(kTimeout) naming the op if it is not done within the communicator's
  /// timeout, Error(kComm) if MPI reported a failure.
  void wait();
  /// As wait(), with an explicit deadline.
  void wait_until(std::chrono::steady_clock::time_point deadline);
  const OpDesc* desc() const { return state_ ? &state_->desc : nullptr; }
  /// Keeps `p` alive until this op's state is destroyed (MPI may read count arrays until completion).
  Work& keep_alive(std::shared_ptr<void> p) {
    if (state_) state_->keep_alive.push_back(std::move(p));
    return *this;
  }
  /// Sets the completion step, run once on the waiting thread after the MPI request completes.
  Work& then(std::function<void()> f) {
    if (state_) state_->on_complete = std::move(f);
    return *this;
  }
  /// Seconds from post to completion (0 until done).
  double elapsed_s() const;

 private:
  friend class Communicator;  // reads state_ to chain a paced exchange behind this op
  void finish();
  std::shared_ptr<WorkState> state_;
  std::shared_ptr<ProgressEngine> engine_;
  std::chrono::milliseconds timeout_{0};
};

/// Waits for every Work in order.
void wait_all(std::vector<Work>& works);

}  // namespace coc
