// Per-thread record buffers of the tracer (runtime/tracer.h). Each thread owns a ThreadBuffer, registered once
// in a global list (the only lock, taken on a thread's first event); appends touch only the thread's own
// buffer. The list keeps buffers alive after their thread exits, so a communication thread's events survive it.
#include "coc/runtime/tracer.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "coc/core/error.h"

namespace coc::trace {

namespace {

constexpr size_t kBlockRecords = 4096;  // ~800 KB per block: one allocation per 4096 events
/// Per-process cap on recorded events (~200 MB of records). A level1 step of the default model records ~2.6·10^3
/// events, so this holds about 400 steps; beyond it events are counted as dropped, not stored.
constexpr uint64_t kMaxEvents = 1u << 20;

struct ThreadBuffer {
  std::vector<std::unique_ptr<Record[]>> blocks;
  size_t used_in_last = kBlockRecords;  // records used in blocks.back(); "full" before the first block exists
  uint64_t count = 0;
};

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  /// Blocks allocated and touched ahead of time (reserve(), clear()): taking one costs a lock per 4096 events;
  /// allocating one on the spot costs a zero-fill and ~200 page faults, measured at milliseconds on a busy VM.
  std::vector<std::unique_ptr<Record[]>> pool;
  std::atomic<uint64_t> total{0};
  std::atomic<uint64_t> dropped{0};
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: threads may record during static destruction
  return *r;
}

ThreadBuffer& my_buffer() {
  thread_local std::shared_ptr<ThreadBuffer> buf = [] {
    auto b = std::make_shared<ThreadBuffer>();
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    reg.buffers.push_back(b);
    return b;
  }();
  return *buf;
}

}  // namespace

const char* to_string(Cat c) {
  switch (c) {
    case Cat::kStep: return "step";
    case Cat::kHost: return "host";
    case Cat::kCompute: return "compute";
    case Cat::kComm: return "comm";
    case Cat::kHostWork: return "host_work";
  }
  return "host";
}

Level parse_level(std::string_view s) {
  if (s == "level0") return Level::kLevel0;
  if (s == "level1") return Level::kLevel1;
  throw_invalid("--profile-level '{}' is not a level; use level0 (steps, layers, collectives, every kernel, host "
                "work) or level1 (also every CoC op and wait)",
                s);
}

const char* to_string(Level l) {
  switch (l) {
    case Level::kOff: return "off";
    case Level::kLevel0: return "level0";
    case Level::kLevel1: return "level1";
  }
  return "off";
}

void set_level(Level level) { detail::g_level.store(static_cast<uint8_t>(level), std::memory_order_relaxed); }
Level level() { return static_cast<Level>(detail::g_level.load(std::memory_order_relaxed)); }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void detail::append(const Record& r) {
  Registry& reg = registry();
  // Relaxed: the cap is approximate across threads by at most one event per thread, which does not matter.
  if (reg.total.fetch_add(1, std::memory_order_relaxed) >= kMaxEvents) {
    reg.dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  ThreadBuffer& b = my_buffer();
  if (b.used_in_last == kBlockRecords) {  // once per kBlockRecords events
    std::unique_ptr<Record[]> block;
    {
      std::lock_guard<std::mutex> lock(reg.mu);
      if (!reg.pool.empty()) {
        block = std::move(reg.pool.back());
        reg.pool.pop_back();
      }
    }
    b.blocks.push_back(block ? std::move(block) : std::make_unique<Record[]>(kBlockRecords));
    b.used_in_last = 0;
  }
  b.blocks.back()[b.used_in_last++] = r;
  ++b.count;
}

namespace {
// The end of the last profiled step: the next step starts exactly there, so consecutive ProfilerSteps tile the
// time line as Kineto's do (a step runs from one prof.step() to the next) and no instant between two profiled
// iterations is left outside every window. Only the training thread touches it.
int64_t g_last_step_end = 0;
int64_t g_last_step_iteration = -2;
}  // namespace

StepScope::StepScope(Level level, int64_t iteration) : on_(level != Level::kOff), iteration_(iteration) {
  if (!on_) return;
  set_level(level);
  begin_ns_ = g_last_step_iteration == iteration - 1 ? g_last_step_end : now_ns();
}

void StepScope::finish() {
  if (!on_) return;
  on_ = false;
  Record r;
  r.cat = Cat::kStep;
  r.track = Track::kHost;
  r.name = "ProfilerStep";
  r.begin_ns = begin_ns_;
  r.end_ns = now_ns();
  r.add("iteration", iteration_);
  detail::append(r);
  g_last_step_end = r.end_ns;
  g_last_step_iteration = iteration_;
  set_level(Level::kOff);
}

const char* intern(std::string_view s) {
  struct Entry {
    std::string_view text;
    const char* ptr;
  };
  thread_local std::vector<Entry> cache;  // a handful of names per thread (ops, communicators)
  for (const Entry& e : cache)
    if (e.text == s) return e.ptr;
  static std::mutex mu;
  static std::set<std::string>* table = new std::set<std::string>;  // nodes never move; never destroyed
  std::lock_guard<std::mutex> lock(mu);
  const std::string& stored = *table->emplace(s).first;
  cache.push_back({stored, stored.c_str()});
  return stored.c_str();
}

std::vector<Record> collect(uint64_t* dropped) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  std::vector<Record> out;
  out.reserve(reg.total.load(std::memory_order_relaxed));
  for (const auto& b : reg.buffers) {
    for (size_t i = 0; i < b->blocks.size(); ++i) {
      const size_t n = i + 1 == b->blocks.size() ? b->used_in_last : kBlockRecords;
      out.insert(out.end(), b->blocks[i].get(), b->blocks[i].get() + n);
    }
  }
  if (dropped) *dropped = reg.dropped.load(std::memory_order_relaxed);
  return out;
}

void reserve(uint64_t events) {
  Registry& reg = registry();
  const uint64_t want = std::min(events, kMaxEvents);
  std::lock_guard<std::mutex> lock(reg.mu);
  uint64_t have = reg.pool.size() * kBlockRecords;
  for (const auto& b : reg.buffers) have += b->blocks.size() * kBlockRecords;
  for (; have < want; have += kBlockRecords) reg.pool.push_back(std::make_unique<Record[]>(kBlockRecords));
}

void clear() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (const auto& b : reg.buffers) {
    // Keep the first block so that a thread's next step does not allocate again; the others go back to the pool.
    for (size_t i = 1; i < b->blocks.size(); ++i) reg.pool.push_back(std::move(b->blocks[i]));
    if (b->blocks.size() > 1) b->blocks.resize(1);
    b->used_in_last = b->blocks.empty() ? kBlockRecords : 0;
    b->count = 0;
  }
  reg.total.store(0, std::memory_order_relaxed);
  reg.dropped.store(0, std::memory_order_relaxed);
}

}  // namespace coc::trace
