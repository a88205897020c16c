// Private to src/comm/: the shared state of one in-flight op behind a Work (coc/comm/work.h). Users hold a Work;
// only the Communicator, the ProgressEngine and the trace hook touch this.
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

#include "coc/comm/work.h"

namespace coc {

/// Shared state of one in-flight op.
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
  int group_root = 0;  ///< the communicator's rank 0 as a world rank (trace events: which group of desc.comm)
  int mpi_tag = -1;  ///< the MPI tag of an exchange's messages (Communicator::exchange_sends reuses it)
  /// MPI reported an error for one of `requests` (communicators return errors, Communicator's constructor): the op
  /// never completes, and every waiter throws kComm with `failure` instead of waiting for the deadline.
  std::atomic<bool> failed{false};
  std::string failure;  ///< written once, before `failed` is set
  std::mutex mu;                       ///< guards cv waits in the threaded engine
  std::condition_variable cv;
};

/// Records `w` (post → completion detected, with op, bytes, seq, communicator, group_root and tag) as a "comm"
/// trace event when tracing is on (runtime/tracer.h, docs/profiling.md). Called by the progress engine once per op.
void trace_completed(const WorkState& w);

}  // namespace coc
