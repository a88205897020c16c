// The progress engine: who calls into MPI while the GEMM runs.
//
// MPI makes no progress on non-blocking collectives unless someone calls into the library. Two engines:
//  - kInline ("polling between chunks"): no extra thread. The CoC schedules call poll() after each GEMM chunk and
//    wait() spins on MPI_Test. Zero extra threads, so nothing steals the GEMM's core, but a collective only moves
//    between chunks.
//  - kThread ("comm thread polling"): one communication thread tests the active requests every `poll_us`
//    microseconds while any are in flight and sleeps on a condition variable when none are. The prototypes measured
//    (docs/performance.md, "Prototypes") that a thread spinning in MPI steals the GEMM's core and that 50–200 µs
//    sleeps were the best naive setting; a thread that has nothing to do must never wake.
// Every MPI call coc makes goes through call(), which holds one mutex: at most one thread is inside MPI at a time,
// so MPI_THREAD_SERIALIZED is enough (docs/design.md: coc never requires MPI_THREAD_MULTIPLE). The exceptions are
// the process queries of comm/process.h, made where no engine thread runs (start-up, `coc env`).
// The engine also keeps the flight recorder: the last kFlightRecorderSize ops, printed on timeouts.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coc/comm/work.h"

namespace coc {

enum class EngineKind { kInline, kThread };

/// "inline" / "thread". Throws a uniform kInvalidArgument error for anything else.
EngineKind parse_engine_kind(const std::string& s);
std::string to_string(EngineKind k);

class ProgressEngine {
 public:
  static constexpr size_t kFlightRecorderSize = 32;

  /// poll_us: sleep between tests of in-flight requests in the threaded engine (µs, >= 1).
  ProgressEngine(EngineKind kind, int poll_us);
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  EngineKind kind() const { return kind_; }
  int poll_us() const { return poll_us_; }

  /// Runs `f` while holding the MPI mutex. Every MPI call in coc goes through here.
  template <typename F>
  auto call(F&& f) {
    std::lock_guard<std::mutex> lock(mpi_mu_);
    return f();
  }

  // track() and wait() take the op's state (src/comm/work_state.h), so only comm/ calls them.
  /// Registers a posted op; the engine tests it until it completes. Records it in the flight recorder.
  void track(const std::shared_ptr<WorkState>& w);
  /// Tests every in-flight op once (MPI_Testall per op). Cheap when nothing is in flight. Inline engine: the CoC
  /// schedules call it between chunks. Threaded engine: a no-op (the thread does it).
  void poll();
  /// Runs `work` (a long kernel that cannot stop to poll, such as one weight-gradient GEMM) while the ops in flight
  /// keep moving: the inline engine lends a communication thread for the duration, testing every poll_us (at least
  /// 1 ms) as the threaded engine does (which needs no help: `work` just runs). Why: MPI moves a posted collective only when
  /// someone calls into it, and splitting the GEMM into pollable pieces would change its bits (OpenBLAS's result
  /// depends on the call's shape). Nothing in flight: `work` runs alone. Errors of the ops are left to their
  /// waiters (as the threaded engine does); `work`'s own exception propagates once the lease is returned.
  void poll_during(const std::function<void()>& work);
  /// The inline engine's communication thread, lent while the lease lives: it tests the ops in flight at once and
  /// then every max(poll_us, 1 ms): poll_during for compute that is not one call, such as a decoder module's
  /// forward between two hooks (FSDP's prefetched gathers). One thread per engine, started by the first lease and
  /// parked between leases: a thread created and joined per lease cost 30-90 µs on a 2-vCPU VM, and the segmented
  /// backward lends one per 60 µs row block (docs/performance.md point 53). Leases may nest.
  class PollLease {
   public:
    explicit PollLease(ProgressEngine& e);
    ~PollLease();
    PollLease(const PollLease&) = delete;
    PollLease& operator=(const PollLease&) = delete;

   private:
    ProgressEngine& e_;
  };
  /// A PollLease, or nullptr when none is needed: the threaded engine drives MPI itself, and with nothing in
  /// flight there is nothing to drive.
  std::unique_ptr<PollLease> lend_poller();
  /// Blocks until `w` is done or `deadline` passes; returns false on expiry. `drive`: the calling thread tests
  /// the ops itself (as the inline engine always does) instead of sleeping until the communication thread sees
  /// `w` complete, which it checks only every poll_us: for the blocking metadata calls of a Communicator, whose
  /// caller has nothing else to do and should not wait a poll period more than the collective takes.
  bool wait(WorkState& w, std::chrono::steady_clock::time_point deadline, bool drive = false);
  /// Text dump of the flight recorder, newest last, one op per line.
  std::string flight_recorder() const;
  /// Number of ops posted but not yet complete.
  size_t in_flight() const;

 private:
  bool test_locked(WorkState& w);  // requires mpi_mu_; throws kComm if `w` failed
  void poll_locked();              // requires mpi_mu_ and active_mu_
  void thread_main();
  void lent_main();  // the PollLease thread

  // PollLease's thread: parked while lent_ is 0; lend_gen_ counts leases, so that each one polls at once.
  std::mutex lend_mu_;
  std::condition_variable lend_cv_;
  int lent_ = 0;
  uint64_t lend_gen_ = 0;
  bool lend_stop_ = false;
  std::thread lend_thread_;

  EngineKind kind_;
  int poll_us_;
  mutable std::mutex mpi_mu_;
  mutable std::mutex active_mu_;
  std::condition_variable active_cv_;
  std::vector<std::shared_ptr<WorkState>> active_;
  std::deque<std::shared_ptr<WorkState>> recorder_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace coc
