// The tracer: records every compute task, collective and host phase of this process with ns timestamps, for
// `coc train --profile` (docs/profiling.md). The output format is Chrome's trace-event JSON, written by
// analysis/trace_writer.h; the levels and flag names follow MindSpeed-LLM's profiler (--profile-level level0 |
// level1), and the "Overlap Analysis" lanes drawn from these records follow Ascend msprof.
//
// Cost model (why it looks like this):
//  - Off: every site is one relaxed load of a global byte and one well-predicted branch (`enabled()`); nothing is
//    allocated, no clock is read, no argument is computed (the macros evaluate arguments only when on).
//  - On: each thread appends fixed-size Records to its own buffer of blocks of 4096 records; a full block is
//    replaced by one from a pool filled ahead of time (reserve()), which takes a lock once per 4096 events and
//    never one per event; no allocation while the pool lasts. Names are static
//    strings (pointers are stored, not copied); the only copied text is a bounded label (a collective's tag).
//  - The buffers are read by collect() once recording has stopped (the trainer turns it off between steps and at
//    the end, and joins nothing: a thread still recording while collect() runs is a bug of the caller).
//
// Tracks ("threads" in the JSON): what an event is drawn on is chosen by the caller (Track), not by the thread
// that records it: a collective's completion may be detected by the communication thread, yet its event belongs
// to the communication track of the rank.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <new>
#include <string_view>
#include <type_traits>
#include <vector>

namespace coc::trace {

/// What is recorded. kLevel0: steps, host phases (forward, backward, layers, optimizer), every collective, every
/// compute kernel (GEMMs, attention, norms, RoPE, SwiGLU, cross-entropy, copies, the optimizer's update, ...) and
/// the host work that is neither (data, logging, checkpoint). kLevel1 adds detail on the host track only: the CoC
/// op spans and the host's waits for collectives. So a level never moves time between Computing, Communication and
/// Free: the categories' unions are the same at every level (docs/profiling.md). Numeric order matters: a site
/// records when its level is <= the global level.
enum class Level : uint8_t { kOff = 0, kLevel0 = 1, kLevel1 = 2 };

/// Event category, written as the JSON "cat" (the contract with analysis/trace readers, docs/profiling.md).
enum class Cat : uint8_t {
  kStep,      ///< "step": one ProfilerStep#<iteration> per profiled iteration
  kHost,      ///< "host": phases that enclose other work (forward, backward, layer, optimizer, CoC op spans, waits)
  kCompute,   ///< "compute": GEMMs and kernels; the Computing lane of the overlap analysis
  kComm,      ///< "comm": one collective from post to detected completion; the Communication lane
  kHostWork,  ///< "host_work": the host busy with work that is neither (data, logging, checkpoint); part of Free,
              ///< which `coc analyze` splits into this host work and idle time
};
const char* to_string(Cat c);

/// The host event of one choice of --coc-parallel-num auto (overlap/auto_schedule.cpp), and the host event inside it
/// that spans the timing of its candidates when it times them: a one-off cost of the run's first calls, which the
/// profile's summary and `coc analyze` show apart from the steady steps (analysis/trace_writer.h).
inline constexpr const char* kAutoChoiceEvent = "coc_auto_choice";
inline constexpr const char* kAutoTimingEvent = "coc_auto_timing";

/// The track an event is drawn on. The writer turns each into a Chrome "thread" of the rank's process;
/// overlapping collectives are spread over several comm tracks there (Perfetto needs nested slices per track).
/// kCounter is a counter sample (Chrome "ph":"C", see counter()), drawn as its own counter track.
enum class Track : uint8_t { kHost = 0, kCompute = 1, kComm = 2, kCounter = 3 };

/// "level0" / "level1" (MindSpeed-LLM's names). Throws a uniform kInvalidArgument error naming --profile-level
/// for anything else.
Level parse_level(std::string_view s);
const char* to_string(Level l);

/// One integer argument; `key` must be a string with static storage duration.
struct Arg {
  const char* key = nullptr;
  int64_t value = 0;
};

/// One complete event ("ph":"X"). Times are this process's steady clock (now_ns()), not yet aligned to rank 0.
struct Record {
  static constexpr int kMaxArgs = 5;
  static constexpr int kLabelBytes = 88;  ///< label text incl. NUL; longer labels are truncated
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
  const char* name = "";      ///< static string: "gemm", "all_reduce", "forward", ...
  const char* context = nullptr;  ///< static string naming the enclosing op (e.g. "matmul_all_reduce"), or null
  const char* label_key = nullptr;  ///< JSON arg key of `label` ("tag", "comm"); null when no label
  Cat cat = Cat::kHost;
  Track track = Track::kHost;
  uint8_t nargs = 0;
  Arg args[kMaxArgs];
  char label[kLabelBytes] = {0};

  /// Appends an argument; ignored beyond kMaxArgs (a programming error, but never worth a crash in a profiler).
  void add(const char* key, int64_t value) {
    if (nargs < kMaxArgs) args[nargs++] = Arg{key, value};
  }
  /// Copies at most kLabelBytes − 1 bytes of `text` (no allocation).
  void set_label(const char* key, std::string_view text) {
    label_key = key;
    const size_t n = text.size() < kLabelBytes - 1 ? text.size() : kLabelBytes - 1;
    std::memcpy(label, text.data(), n);
    label[n] = '\0';
  }
};

static_assert(std::is_trivially_destructible_v<Record> && std::is_trivially_copyable_v<Record>,
              "Records are copied into preallocated blocks and never destroyed one by one");

namespace detail {
/// The global level; read with one relaxed load per site. Written only by set_level().
inline std::atomic<uint8_t> g_level{0};
/// Name of the op enclosing this thread's compute events (see Context).
inline thread_local const char* t_context = nullptr;
void append(const Record& r);  // the thread's buffer; allocation only when a block fills
}  // namespace detail

/// True when sites of `level` record. The one branch a disabled site pays.
inline bool enabled(Level level) {
  return static_cast<uint8_t>(level) <= detail::g_level.load(std::memory_order_relaxed) && level != Level::kOff;
}
/// Sets what is recorded from now on (kOff stops recording). The trainer calls it at the edges of profiled steps.
void set_level(Level level);
Level level();

/// Monotonic clock in ns (CLOCK_MONOTONIC through std::chrono::steady_clock: the clock Work uses, so its
/// time points convert exactly). Costs ~20 ns (vDSO).
int64_t now_ns();

/// Appends a finished event to this thread's buffer if `level` is enabled. For explicit begin/end pairs (a
/// collective posted on one thread and completed on another, a step whose end is known only later).
inline void record(Level level, const Record& r) {
  if (enabled(level)) detail::append(r);
}

/// Records one sample of the counter `name` (a static string, e.g. "fsdp gathered bytes"): its value `value` under
/// the key `key` (static) from now on, as a Chrome counter event. For quantities that change over a step (bytes
/// held), where a span would say nothing.
inline void counter(Level level, const char* name, const char* key, int64_t value) {
  if (!enabled(level)) return;
  Record r;
  r.cat = Cat::kHost;
  r.track = Track::kCounter;
  r.name = name;
  r.begin_ns = r.end_ns = now_ns();
  r.add(key, value);
  detail::append(r);
}

/// RAII span: records [construction, destruction) as one event when `level` was enabled at construction.
/// Use through COC_TRACE_SCOPE. Not copyable; one per scope.
class Scope {
 public:
  Scope(Cat cat, Level level, const char* name) : on_(enabled(level)) {
    if (on_) {
      new (&r_) Record();  // constructed only when on: a disabled site must not even zero the record
      r_.cat = cat;
      r_.track = cat == Cat::kCompute ? Track::kCompute : cat == Cat::kComm ? Track::kComm : Track::kHost;
      r_.name = name;
      r_.context = detail::t_context;
      r_.begin_ns = now_ns();
    }
  }
  ~Scope() {
    if (on_) {
      r_.end_ns = now_ns();
      detail::append(r_);
    }
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  bool on() const { return on_; }
  void args(std::initializer_list<Arg> a) {
    for (const Arg& x : a) r_.add(x.key, x.value);
  }
  void label(const char* key, std::string_view text) { r_.set_label(key, text); }

 private:
  bool on_;
  union {
    Record r_;  // trivially destructible; live only when on_
  };
};

/// Names the operation that encloses this thread's compute events until destruction (e.g. a CoC op around its
/// chunk GEMMs), written as the event arg "op". Lets a reader sum exactly the GEMMs the verbose CocStats timer
/// measures. Costs two thread-local stores.
class Context {
 public:
  explicit Context(const char* op) : prev_(detail::t_context) { detail::t_context = op; }
  ~Context() { detail::t_context = prev_; }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

 private:
  const char* prev_;
};

/// A pointer with static storage duration to a copy of `s`, equal for equal strings: turns names known only at run
/// time (a communicator's name, an op name held in a std::string) into Record names. Lock-free after a thread's
/// first call for a given string (a small thread-local cache); the global table takes a lock on a miss.
const char* intern(std::string_view s);

/// One training step under the profiler (Kineto's ProfilerStep): sets the global level to `level` on
/// construction and, at finish() (or destruction), records the step as "ProfilerStep#<iteration>" (cat "step",
/// host track) and turns recording off, so that nothing outside profiled steps is recorded. A step that directly
/// follows the previous profiled iteration begins exactly where it ended: consecutive steps tile the time line,
/// so the sum of the step windows equals their span (the two definitions of a rank's total agree). With kOff it
/// does nothing at all: unprofiled steps cost one branch. Use from one thread (the training loop).
class StepScope {
 public:
  StepScope(Level level, int64_t iteration);
  ~StepScope() { finish(); }
  void finish();
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  bool on_;
  int64_t iteration_;
  int64_t begin_ns_ = 0;
};

/// Everything recorded so far, from every thread, in no particular order. Call only while no thread records
/// (after set_level(kOff) and once the recording threads are quiet). `dropped` receives the number of events
/// lost to the per-process cap (COC_TRACE_MAX_EVENTS).
std::vector<Record> collect(uint64_t* dropped = nullptr);
/// Allocates and touches buffer space for `events` records (capped at the per-process limit) ahead of time, so
/// that recording never waits for fresh memory. The profiler calls it before training. Thread-safe; not for
/// the hot path.
void reserve(uint64_t events);
/// Drops every record (buffers are kept for reuse). Same rule as collect().
void clear();

}  // namespace coc::trace

#define COC_TRACE_CAT2(a, b) a##b
#define COC_TRACE_CAT(a, b) COC_TRACE_CAT2(a, b)
/// COC_TRACE_SCOPE(cat, level, "name" [, {"key", value}, ...]): times the rest of the enclosing block. The
/// arguments (at most Record::kMaxArgs) are evaluated only when the site records. Example:
///   COC_TRACE_SCOPE(coc::trace::Cat::kCompute, coc::trace::Level::kLevel0, "gemm", {"m", m}, {"n", n});
/// Compute kernels and host work record at kLevel0: they decide the categories, which must not depend on the level.
#define COC_TRACE_SCOPE(cat, level, name, ...)                                       \
  ::coc::trace::Scope COC_TRACE_CAT(coc_trace_scope_, __LINE__)(cat, level, name); \
  __VA_OPT__(if (COC_TRACE_CAT(coc_trace_scope_, __LINE__).on())                    \
                 COC_TRACE_CAT(coc_trace_scope_, __LINE__).args({__VA_ARGS__}))
