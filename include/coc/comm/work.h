// Work: the handle of one asynchronous collective, in the style of PyTorch c10d's Work objects.
//
// A Work is created by a Communicator's i* call and completes when its MPI request does. `wait()` blocks the
// caller until then or until the deadline; on expiry it throws a kTimeout error that names the op, its sequence
// number and byte count, and dumps the flight recorder (the last ops on this rank), so that a stuck job says
// which collective it is stuck in. A Work may carry a completion step (for example the fixed-order local sum of
// the deterministic all-reduce) that runs on the waiting thread, once, after the MPI request finished.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace coc {

class ProgressEngine;
struct WorkState;  // private to comm/ (src/comm/work_state.h): the MPI requests of one op

/// What a Work is doing; kept in the flight recorder and printed on errors.
struct OpDesc {
  std::string comm;        ///< communicator name ("tp", "dp", "world")
  std::string op;          ///< "all_reduce", "reduce_scatter", ...
  std::string tag;         ///< caller's label, e.g. "row_fwd chunk 2/4 [1024, 4096]"
  uint64_t seq = 0;        ///< per-communicator sequence number, identical across ranks for the same op
  int64_t bytes = 0;       ///< bytes this rank contributes
  std::string to_string() const;
};

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
  /// What the op is (nullptr for a default-constructed Work).
  const OpDesc* desc() const;
  /// Keeps `p` alive until this op's state is destroyed (MPI may read count arrays until completion).
  Work& keep_alive(std::shared_ptr<void> p);
  /// Adds a completion step, run once on the waiting thread after the MPI request completes, after any step set
  /// before (an op's own, e.g. the p2p reduce-scatter's sum).
  Work& then(std::function<void()> f);
  /// Seconds from post to completion (0 until done).
  double elapsed_s() const;

 private:
  friend class Communicator;  // reads state_ to chain a paced exchange behind this op; waits for metadata ops
  /// wait_until(); `drive`: the calling thread tests the op itself, also with the threaded engine, instead of
  /// sleeping until the communication thread sees it complete (Communicator's blocking metadata calls).
  void wait_impl(std::chrono::steady_clock::time_point deadline, bool drive);
  void finish();
  std::shared_ptr<WorkState> state_;
  std::shared_ptr<ProgressEngine> engine_;
  std::chrono::milliseconds timeout_{0};
};

/// Waits for every Work in order.
void wait_all(std::vector<Work>& works);

}  // namespace coc
