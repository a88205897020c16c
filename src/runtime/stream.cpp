#include "coc/runtime/stream.h"

#include <utility>

#include "coc/core/error.h"

namespace coc {

// ---- Event ------------------------------------------------------------------------------------------------------

Event::Event() : state_(std::make_shared<State>()) {}

void Event::record(Stream& stream) {
  uint64_t gen = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    gen = ++state_->recorded;
  }
  // The marker holds the state, not the Event, so the Event may be destroyed before the stream reaches it.
  stream.push({[st = state_, gen] {
                 {
                   std::lock_guard<std::mutex> lock(st->mu);
                   // max(): records on two streams may complete out of order; the newest one decides.
                   if (gen > st->completed) st->completed = gen;
                 }
                 st->cv.notify_all();
               },
               /*internal=*/true});
}

bool Event::query() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->completed >= state_->recorded;
}

bool Event::wait_until(std::chrono::steady_clock::time_point deadline) const {
  std::unique_lock<std::mutex> lock(state_->mu);
  const uint64_t gen = state_->recorded;
  return state_->cv.wait_until(lock, deadline, [&] { return state_->completed >= gen; });
}

bool Event::wait_for(std::chrono::nanoseconds timeout) const {
  return wait_until(std::chrono::steady_clock::now() + timeout);
}

// ---- Stream -----------------------------------------------------------------------------------------------------

Stream::Stream(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] { thread_main(); });
}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_one();
  thread_.join();
}

void Stream::push(Task t) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(t));
    ++enqueued_;
  }
  work_cv_.notify_one();
}

void Stream::enqueue(std::function<void()> task) {
  if (!task) throw_error(ErrorKind::kInternal, "Stream '{}': enqueue of an empty task", name_);
  push({std::move(task), /*internal=*/false});
}

void Stream::wait_event(const Event& event) {
  auto st = event.state_;
  uint64_t gen = 0;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    gen = st->recorded;  // CUDA semantics: wait for the record current at the time of this call
  }
  if (gen == 0) return;
  push({[st, gen] {
          std::unique_lock<std::mutex> lock(st->mu);
          st->cv.wait(lock, [&] { return st->completed >= gen; });
        },
        /*internal=*/true});
}

void Stream::synchronize() {
  if (std::this_thread::get_id() == thread_.get_id())
    throw_error(ErrorKind::kInternal,
                "Stream '{}': synchronize() called from a task on the same stream; it would wait for itself forever",
                name_);
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = enqueued_;
    done_cv_.wait(lock, [&] { return finished_ >= target; });
    err = std::exchange(error_, nullptr);
  }
  if (err) std::rethrow_exception(err);
}

bool Stream::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_ == enqueued_;
}

void Stream::thread_main() {
  for (;;) {
    Task t;
    bool skip = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Sleeps (no polling) while there is nothing to do: an idle stream must not steal the GEMM's core.
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ set and everything drained
      t = std::move(queue_.front());
      queue_.pop_front();
      skip = error_ != nullptr && !t.internal;
    }
    if (!skip) {
      try {
        t.fn();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++finished_;
    }
    done_cv_.notify_all();
  }
}

}  // namespace coc
