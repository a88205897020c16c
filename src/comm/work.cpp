#include "coc/comm/work.h"

#include <fmt/format.h>

#include "coc/comm/progress_engine.h"
#include "coc/core/error.h"
#include "coc/core/log.h"
#include "work_state.h"

namespace coc {

std::string OpDesc::to_string() const {
  return fmt::format("{}#{} on '{}' ({} bytes){}{}", op, seq, comm, bytes, tag.empty() ? "" : ": ", tag);
}

bool Work::test() {
  if (!state_) return true;
  if (!state_->done.load(std::memory_order_acquire)) engine_->poll();
  if (!state_->done.load(std::memory_order_acquire)) return false;
  finish();
  return true;
}

const OpDesc* Work::desc() const { return state_ ? &state_->desc : nullptr; }

Work& Work::keep_alive(std::shared_ptr<void> p) {
  if (state_) state_->keep_alive.push_back(std::move(p));
  return *this;
}

Work& Work::then(std::function<void()> f) {
  if (!state_) return *this;
  if (state_->on_complete)  // the op's own step (a p2p reduce-scatter's sum) runs before the caller's
    state_->on_complete = [first = std::move(state_->on_complete), next = std::move(f)] {
      first();
      next();
    };
  else
    state_->on_complete = std::move(f);
  return *this;
}

void Work::wait() { wait_until(std::chrono::steady_clock::now() + timeout_); }

void Work::wait_until(std::chrono::steady_clock::time_point deadline) { wait_impl(deadline, /*drive=*/false); }

void Work::wait_impl(std::chrono::steady_clock::time_point deadline, bool drive) {
  if (!state_) return;
  if (!engine_->wait(*state_, deadline, drive)) {
    // Report the time since the op was posted, not the communicator's default timeout: wait_until() callers pass
    // their own deadline, and a message saying "300000 ms" after a 200 ms wait misleads.
    const double waited_ms = std::chrono::duration<double, std::milli>(deadline - state_->start).count();
    const std::string waited = waited_ms >= 10000 ? fmt::format("{:.0f} s", waited_ms / 1000)
                               : waited_ms >= 10  ? fmt::format("{:.0f} ms", waited_ms)
                                                  : fmt::format("{:.2g} ms", waited_ms);
    throw_error(ErrorKind::kTimeout,
                "rank {}: collective {} did not complete within {}. A peer rank is probably stuck or dead, or "
                "ranks issued collectives in different orders (re-run with --debug-collectives to check). "
                "Last ops on this rank:\n{}",
                log::rank(), state_->desc.to_string(), waited, engine_->flight_recorder());
  }
  finish();
}

void Work::finish() {
  if (!state_->completed_callback) {
    state_->completed_callback = true;
    if (state_->on_complete) state_->on_complete();
    // The flight recorder keeps the state alive after completion: drop what it no longer needs (count arrays,
    // captured scratch buffers) so that finished ops hold no memory.
    state_->on_complete = nullptr;
    state_->keep_alive.clear();
  }
}

double Work::elapsed_s() const {
  if (!state_ || !state_->done.load(std::memory_order_acquire)) return 0.0;
  return std::chrono::duration<double>(state_->end - state_->start).count();
}

void wait_all(std::vector<Work>& works) {
  for (auto& w : works) w.wait();
}

}  // namespace coc
