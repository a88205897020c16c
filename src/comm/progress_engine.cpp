#include "coc/comm/progress_engine.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>

#include "coc/comm/wait_filler.h"
#include "coc/core/error.h"
#include "work_state.h"

namespace coc {

EngineKind parse_engine_kind(const std::string& s) {
  if (s == "inline") return EngineKind::kInline;
  if (s == "thread") return EngineKind::kThread;
  throw_invalid("unknown --comm-engine '{}'; use 'inline' (poll between GEMM chunks) or 'thread' (a sleeping "
                "communication thread)",
                s);
}
std::string to_string(EngineKind k) { return k == EngineKind::kInline ? "inline" : "thread"; }

ProgressEngine::ProgressEngine(EngineKind kind, int poll_us) : kind_(kind), poll_us_(poll_us) {
  if (poll_us < 1) throw_invalid("--comm-poll-us must be >= 1 (got {})", poll_us);
  if (kind_ == EngineKind::kThread) thread_ = std::thread([this] { thread_main(); });
}

ProgressEngine::~ProgressEngine() {
  if (lend_thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(lend_mu_);
      lend_stop_ = true;
    }
    lend_cv_.notify_all();
    lend_thread_.join();
  }
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(active_mu_);
      stop_ = true;
    }
    active_cv_.notify_all();
    thread_.join();
  }
}

void ProgressEngine::track(const std::shared_ptr<WorkState>& w) {
  {
    std::lock_guard<std::mutex> lock(active_mu_);
    recorder_.push_back(w);
    if (recorder_.size() > kFlightRecorderSize) recorder_.pop_front();
    if (!w->done.load(std::memory_order_acquire)) active_.push_back(w);
  }
  if (kind_ == EngineKind::kThread) active_cv_.notify_one();
}

namespace {
/// Done, or failed (WorkState::failed): nothing more to test.
bool finished(const WorkState& w) {
  return w.done.load(std::memory_order_acquire) || w.failed.load(std::memory_order_acquire);
}

/// The text of the first error among `requests` after MPI_Testall returned `rc` (MPI_ERR_IN_STATUS names none).
std::string mpi_error_text(int rc, const std::vector<MPI_Status>& statuses) {
  if (rc == MPI_ERR_IN_STATUS)
    for (const MPI_Status& st : statuses)
      if (st.MPI_ERROR != MPI_SUCCESS && st.MPI_ERROR != MPI_ERR_PENDING) {
        rc = st.MPI_ERROR;
        break;
      }
  char err[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, err, &len);
  return std::string(err, static_cast<size_t>(len));
}

/// Records MPI's error `rc` (statuses: those of the failed MPI_Testall) in `w`, wakes its waiters, and throws it
/// (kComm): the ops of a failed call are freed by MPI, so the next test would find them complete.
[[noreturn]] void fail(WorkState& w, int rc, const std::vector<MPI_Status>& statuses) {
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.failure = fmt::format("MPI failure in {}: {} (the ranks disagree on this op's sizes or types, or a peer "
                            "failed; --debug-collectives compares every collective's arguments across the ranks)",
                            w.desc.to_string(), mpi_error_text(rc, statuses));
    w.failed.store(true, std::memory_order_release);
  }
  w.cv.notify_all();
  throw_error(ErrorKind::kComm, "{}", w.failure);
}
}  // namespace

bool ProgressEngine::test_locked(WorkState& w) {
  thread_local std::vector<MPI_Status> statuses;  // MPI_ERR_IN_STATUS's detail (fail); sized once per thread
  if (w.done.load(std::memory_order_acquire)) return true;
  if (w.failed.load(std::memory_order_acquire)) throw_error(ErrorKind::kComm, "{}", w.failure);
  if (w.deferred) {  // paced sends (Communicator::exchange): posted once the previous exchange's sends have left
    WorkState& a = *w.after;
    auto left = [&] { return a.sends_done.load(std::memory_order_acquire) || a.done.load(std::memory_order_acquire); };
    if (!left()) test_locked(a);  // drive the chain: an inline waiter tests only its own op, not its predecessors
    if (!left()) return false;
    auto deferred = std::move(w.deferred);
    w.deferred = nullptr;
    w.after.reset();
    deferred(w.requests);
  }
  if (w.sends_from < w.requests.size() && !w.sends_done.load(std::memory_order_relaxed)) {
    // Completed sends become MPI_REQUEST_NULL, which the MPI_Testall over every request below takes as complete.
    int sent = 0;
    statuses.resize(w.requests.size() - w.sends_from);
    const int rc = MPI_Testall(static_cast<int>(w.requests.size() - w.sends_from), w.requests.data() + w.sends_from,
                               &sent, statuses.data());
    if (rc != MPI_SUCCESS) fail(w, rc, statuses);  // the failed requests are freed: the next test would miss it
    if (sent) w.sends_done.store(true, std::memory_order_release);
  } else if (w.sends_from != SIZE_MAX && !w.deferred) {
    w.sends_done.store(true, std::memory_order_release);  // an exchange with nothing to send
  }
  int flag = 0;
  statuses.resize(w.requests.size());
  const int rc = MPI_Testall(static_cast<int>(w.requests.size()), w.requests.data(), &flag, statuses.data());
  if (rc != MPI_SUCCESS) fail(w, rc, statuses);
  if (!flag) return false;
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.end = std::chrono::steady_clock::now();
  }
  // Recorded before `done` is published: a waiter that returns may stop the trace at once (the profiler's last step),
  // while the thread that saw the completion (a lent or communication thread) would still be recording it.
  trace_completed(w);
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.done.store(true, std::memory_order_release);
  }
  w.cv.notify_all();
  return true;
}

void ProgressEngine::poll() {
  if (kind_ == EngineKind::kThread) return;
  std::vector<std::shared_ptr<WorkState>> snapshot;
  {
    std::lock_guard<std::mutex> lock(active_mu_);
    if (active_.empty()) return;
    snapshot = active_;
  }
  {
    std::lock_guard<std::mutex> lock(mpi_mu_);
    for (auto& w : snapshot)
      if (!finished(*w)) test_locked(*w);  // a failed op throws once, to its own test; its waiters rethrow
  }
  std::lock_guard<std::mutex> lock(active_mu_);
  std::erase_if(active_, [](const auto& w) { return finished(*w); });
}

void ProgressEngine::poll_during(const std::function<void()>& work) {
  const std::unique_ptr<PollLease> lease = lend_poller();  // returned after `work`, also when it throws
  work();
}

std::unique_ptr<ProgressEngine::PollLease> ProgressEngine::lend_poller() {
  if (kind_ == EngineKind::kThread || in_flight() == 0) return nullptr;
  return std::make_unique<PollLease>(*this);
}

ProgressEngine::PollLease::PollLease(ProgressEngine& e) : e_(e) {
  {
    std::lock_guard<std::mutex> lock(e.lend_mu_);
    if (!e.lend_thread_.joinable()) e.lend_thread_ = std::thread([&e] { e.lent_main(); });
    ++e.lent_;
    ++e.lend_gen_;
  }
  e.lend_cv_.notify_one();
}

ProgressEngine::PollLease::~PollLease() {
  std::lock_guard<std::mutex> lock(e_.lend_mu_);
  --e_.lent_;  // the thread parks after its current sleep; nothing waits for it
}

void ProgressEngine::lent_main() {
  // At least 1 ms between tests: on the 1 Gbit/s cluster testing more often only slowed the GEMM sharing the core
  // (docs/performance.md, the thread engine's polls and the point-to-point schedules' one poll per chunk), and a
  // socket buffer holds more than a millisecond of the link.
  const auto period = std::chrono::microseconds(std::max(poll_us_, 1000));
  std::unique_lock<std::mutex> lock(lend_mu_);
  for (;;) {
    lend_cv_.wait(lock, [&] { return lend_stop_ || lent_ > 0; });
    if (lend_stop_) return;
    const uint64_t gen = lend_gen_;
    lock.unlock();
    try {
      poll();
    } catch (const Error&) {
      // The failing op is marked failed: its waiter throws its error (as in thread_main).
    }
    lock.lock();
    lend_cv_.wait_for(lock, period, [&] { return lend_stop_ || lend_gen_ != gen; });
  }
}

bool ProgressEngine::wait(WorkState& w, std::chrono::steady_clock::time_point deadline, bool drive) {
  if (w.done.load(std::memory_order_acquire)) return true;
  // Another micro-batch's compute first (comm/wait_filler.h), while the op moves: the threaded engine's thread tests
  // it meanwhile, the inline engine between the units.
  while (WaitFiller::run_unit()) {
    if (kind_ == EngineKind::kInline || drive) poll();
    if (w.done.load(std::memory_order_acquire)) return true;
  }
  if (kind_ == EngineKind::kThread && !drive) {
    std::unique_lock<std::mutex> lock(w.mu);
    const bool ended = w.cv.wait_until(lock, deadline, [&] { return finished(w); });
    if (w.failed.load(std::memory_order_acquire)) throw_error(ErrorKind::kComm, "{}", w.failure);
    return ended;
  }
  // Inline engine (or a driving wait): the waiting thread is the only one that can drive MPI (or the one in a
  // hurry), and it has nothing else to do, so it tests continuously. With the threaded engine the communication
  // thread may test the same op too; the MPI mutex serialises them, and poll() below is then a no-op. sched_yield lets an oversubscribed peer rank on the same core run its half of the copy.
  // Every other op in flight is tested too (poll): a paced send (Communicator::exchange_sends) is posted only when
  // its own op is tested, and the receives waited for here may be the peer's answer to it. Testing only `w`, two
  // ranks each waiting for a receive whose matching send sits queued on the other rank would wait for ever.
  for (;;) {
    bool done;
    {
      std::lock_guard<std::mutex> lock(mpi_mu_);
      done = test_locked(w);
    }
    if (done) break;
    poll();
    if (std::chrono::steady_clock::now() > deadline) return false;
    sched_yield();
  }
  poll();  // drop it (and any other finished op) from the active list
  return true;
}

void ProgressEngine::thread_main() {
  std::vector<std::shared_ptr<WorkState>> snapshot;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(active_mu_);
      active_cv_.wait(lock, [&] { return stop_ || !active_.empty(); });
      // Stop even with ops in flight. The engine is destroyed only when no Work refers to it any more, so an op
      // still active here was abandoned, typically by an exception unwinding past it (a timeout whose peer is
      // dead). Waiting for it to drain would hang the unwinding rank forever instead of letting the error
      // policy abort the job (edge case 18 of docs/edge-cases.md).
      if (stop_) return;
      snapshot = active_;
    }
    try {
      std::lock_guard<std::mutex> lock(mpi_mu_);
      for (auto& w : snapshot)
        if (!finished(*w)) test_locked(*w);
    } catch (const Error&) {
      // The failing op is marked failed (fail()): its waiter throws the error, which names it.
    }
    {
      std::lock_guard<std::mutex> lock(active_mu_);
      std::erase_if(active_, [](const auto& w) { return finished(*w); });
      if (active_.empty()) continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(poll_us_));
  }
}

std::string ProgressEngine::flight_recorder() const {
  std::lock_guard<std::mutex> lock(active_mu_);
  std::string out;
  for (const auto& w : recorder_) {
    bool done = w->done.load(std::memory_order_acquire);
    out += fmt::format("  {} {}\n", done ? "[done]   " : "[pending]", w->desc.to_string());
  }
  return out;
}

size_t ProgressEngine::in_flight() const {
  std::lock_guard<std::mutex> lock(active_mu_);
  return active_.size();
}

}  // namespace coc
