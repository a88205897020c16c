// The generic, format-neutral pass over a trace file: one event at a time, nothing kept but trace_model.h's
// records. Which events are kept is decided from the raw fields before any name is interned, so the common
// host-side events (cpu_op, python_function, flows) cost one scan and no allocation.
#include <charconv>
#include <cmath>
#include <cstring>
#include <fmt/format.h>

#include "coc/runtime/tracer.h"
#include "event_classify.h"
#include "json_scanner.h"
#include "trace_reader.h"

namespace coc::analysis::detail {

namespace {

/// The fields of one event the analysis looks at; buffers are reused from event to event.
struct RawEvent {
  char ph = 0;
  std::string cat, name, arg_name, task_type, key, tmp;
  std::string group, pg_name;  ///< args "comm" (coc) or "Process Group Description" (Kineto); "Process Group Name"
  std::string tag;             ///< args "tag" (coc's collectives: the operation that issued them)
  NumberText ts, dur;
  bool has_ts = false, has_dur = false;
  int64_t pid = 0, tid = 0;
  bool has_stream = false;
  int64_t stream = -1, corr = -1;
  int64_t seq = -1, group_root = -1;  ///< args of coc's collectives (docs/profiling.md)
  bool repaired = false;
  void reset() {
    ph = 0;
    cat.clear(), name.clear(), arg_name.clear(), task_type.clear(), group.clear(), pg_name.clear(), tag.clear();
    ts.len = dur.len = 0;
    has_ts = has_dur = has_stream = repaired = false;
    pid = tid = 0;
    stream = corr = seq = group_root = -1;
  }
};

// pid/tid: integers (some above 2^32, edge case 29 of docs/edge-cases.md), or strings such as "stream 7" (legacy
// Kineto) whose trailing number is the stream; other strings are hashed to a stable key.
int64_t read_id(JsonScanner& sc, RawEvent& ev) {
  if (sc.peek() == '"') {
    ev.repaired |= sc.read_string(ev.tmp);
    size_t i = ev.tmp.size();
    while (i > 0 && ev.tmp[i - 1] >= '0' && ev.tmp[i - 1] <= '9') --i;
    int64_t v = 0;
    if (i < ev.tmp.size() && ev.tmp.size() - i < 18) {
      std::from_chars(ev.tmp.data() + i, ev.tmp.data() + ev.tmp.size(), v);
      return v;
    }
    return static_cast<int64_t>(std::hash<std::string>{}(ev.tmp) >> 1);
  }
  NumberText n;
  if (!sc.read_number(n)) return 0;
  int64_t v = 0;
  if (number_to_int(n, v)) return v;
  return static_cast<int64_t>(std::hash<std::string_view>{}(std::string_view(n.text, n.len)) >> 1);
}

void read_args(JsonScanner& sc, RawEvent& ev) {
  if (sc.peek() != '{') {
    sc.skip_value();
    return;
  }
  sc.expect('{', "'{'");
  if (sc.accept('}')) return;
  do {
    ev.repaired |= sc.read_string(ev.key);
    sc.expect(':', "':'");
    const std::string& k = ev.key;
    if (k == "stream") {
      NumberText n;
      int64_t v = 0;
      if (sc.read_number(n) && number_to_int(n, v)) ev.has_stream = true, ev.stream = v;
    } else if (k == "correlation") {
      NumberText n;
      int64_t v = 0;
      if (sc.read_number(n) && number_to_int(n, v)) ev.corr = v;
    } else if (k == "seq" || k == "group_root") {
      NumberText n;
      int64_t v = 0;
      if (sc.read_number(n) && number_to_int(n, v)) (k == "seq" ? ev.seq : ev.group_root) = v;
    } else if (k == "name" && sc.peek() == '"') {
      ev.repaired |= sc.read_string(ev.arg_name);
    } else if (k == "Task Type" && sc.peek() == '"') {
      ev.repaired |= sc.read_string(ev.task_type);
    } else if ((k == "comm" || k == "Process Group Description") && sc.peek() == '"') {
      ev.repaired |= sc.read_string(ev.group);
    } else if (k == "tag" && sc.peek() == '"') {
      ev.repaired |= sc.read_string(ev.tag);
    } else if (k == "Process Group Name" && sc.peek() == '"') {
      ev.repaired |= sc.read_string(ev.pg_name);
    } else if (k == "Process Group Name") {  // some PyTorch versions write the number unquoted
      NumberText n;
      if (sc.read_number(n)) ev.pg_name.assign(n.text, n.len);
    } else {
      sc.skip_value();
    }
  } while (sc.accept(','));
  sc.expect('}', "'}' or ','");
}

void read_event(JsonScanner& sc, RawEvent& ev) {
  ev.reset();
  sc.expect('{', "an event object");
  if (sc.accept('}')) return;
  do {
    ev.repaired |= sc.read_string(ev.key);
    sc.expect(':', "':'");
    const std::string& k = ev.key;
    if (k.size() == 2 && k == "ph") {
      if (sc.peek() == '"') {
        ev.repaired |= sc.read_string(ev.tmp);
        ev.ph = ev.tmp.empty() ? 0 : ev.tmp[0];
      } else {
        sc.skip_value();
      }
    } else if (k == "ts") {
      ev.has_ts = sc.read_number(ev.ts);
    } else if (k == "dur") {
      ev.has_dur = sc.read_number(ev.dur);
    } else if (k == "name") {
      if (sc.peek() == '"') ev.repaired |= sc.read_string(ev.name);
      else sc.skip_value();
    } else if (k == "cat") {
      if (sc.peek() == '"') ev.repaired |= sc.read_string(ev.cat);
      else sc.skip_value();
    } else if (k == "pid") {
      ev.pid = read_id(sc, ev);
    } else if (k == "tid") {
      ev.tid = read_id(sc, ev);
    } else if (k == "args") {
      read_args(sc, ev);
    } else {
      sc.skip_value();
    }
  } while (sc.accept(','));
  sc.expect('}', "'}' or ','");
}

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// HTA's rounding of one bound: ceil for begins, floor for ends, in double µs (trace_parser.py). Integer text is
// exact, so only fractional values take the double route.
int64_t hta_bound(const NumberText& ts, const NumberText* dur, bool is_end) {
  const bool int_ts = !std::memchr(ts.text, '.', ts.len) && !std::memchr(ts.text, 'e', ts.len);
  const bool int_dur = !dur || (!std::memchr(dur->text, '.', dur->len) && !std::memchr(dur->text, 'e', dur->len));
  if (int_ts && int_dur) {
    int64_t a = 0, b = 0;
    number_to_int(ts, a);
    if (dur) number_to_int(*dur, b);
    return a + b;
  }
  double a = 0, b = 0;
  std::from_chars(ts.text, ts.text + ts.len, a);
  if (dur) std::from_chars(dur->text, dur->text + dur->len, b);
  return is_end ? static_cast<int64_t>(std::floor(a + b)) : static_cast<int64_t>(std::ceil(a));
}

class Collector {
 public:
  explicit Collector(CollectedTrace& out) : out_(out) {}

  void on_event(RawEvent& ev) {
    ++out_.total_events;
    if (ev.repaired) ++out_.malformed_events;
    if (ev.ph == 'M') return on_metadata(ev);
    if (ev.ph != 'X' && !(ev.ph == 0 && ev.has_dur)) return;
    int64_t ts = 0, dur = 0;
    if (!ev.has_ts || !ev.has_dur || !number_to_ns(ev.ts, ts) || !number_to_ns(ev.dur, dur)) return;
    const bool coc_cat = ev.cat == "compute" || ev.cat == "comm" || ev.cat == "step" || ev.cat == "host" ||
                         ev.cat == "host_work" || ev.cat == "overlap_analysis";
    // CUPTI buffer fault (edge case 25): flagged, kept out of every window. coc's own files legitimately start at
    // ts 0, so its categories are exempt.
    if (ts == 0 && dur == 0 && !coc_cat) {
      ++out_.zero_ts_events;
      return;
    }
    // Of coc's host events only auto's timings (trace::kAutoTimingEvent) are read.
    const bool keep = out_.top_level_array || ev.has_stream || ev.corr != -1 || starts_with(ev.name, "ProfilerStep") ||
                      (coc_cat && (ev.cat != "host" || ev.name == trace::kAutoTimingEvent));
    if (ev.has_stream && ev.stream != -1 && !out_.seen_device) {
      out_.seen_device = true;
      std::deque<RawKept>().swap(out_.cpu_ops);
    }
    const bool cpu_op = !keep && !out_.seen_device && (ev.cat == "cpu_op" || ev.cat == "user_annotation");
    if (!keep && !cpu_op) return;
    RawKept k;
    k.ts = ts;
    k.end = ts + (dur > 0 ? dur : 0);  // a negative duration is an empty event, never a negative one (case 22)
    // Consecutive events mostly share a thread: skip the lookup then.
    if (!(ev.pid == last_pid_ && ev.tid == last_tid_ && have_last_)) {
      last_thread_ = out_.thread_id(ev.pid, ev.tid);
      last_pid_ = ev.pid, last_tid_ = ev.tid, have_last_ = true;
    }
    k.thread = last_thread_;
    k.has_stream = ev.has_stream;
    k.stream = ev.has_stream ? ev.stream : -1;
    k.corr = ev.corr;
    k.name = out_.names.intern(ev.name);
    k.cat = out_.names.intern(ev.cat);
    // Ascend's task type, or the operation of a coc collective: its tag reduced to the op (comm_op_name), interned
    // so that a trace's thousands of chunk tags cost a few dozen names.
    if (!ev.task_type.empty())
      k.extra = out_.names.intern(ev.task_type);
    else if (ev.cat == "comm" && !ev.tag.empty())
      k.extra = out_.names.intern(comm_op_name(ev.tag));
    // The communicator a collective ran on: coc names it ("tp", "fsdp dp-cp"); PyTorch's Kineto gives a process
    // group's description ("default_pg") and its name (a number), the description being the readable one.
    const std::string& group = ev.group.empty() ? ev.pg_name : ev.group;
    k.group = group.empty() ? 0 : out_.names.intern(group);
    if (ev.cat == "comm") k.collective = collective_key(ev.group_root, ev.seq);
    const int64_t hb = hta_bound(ev.ts, nullptr, false), he = hta_bound(ev.ts, &ev.dur, true);
    k.hta_begin_adj = static_cast<int8_t>(hb - floor_div(k.ts, 1000));
    k.hta_end_adj = static_cast<int8_t>(he - floor_div(k.end, 1000));
    (cpu_op ? out_.cpu_ops : out_.events).push_back(k);
  }

  void on_metadata(RawEvent& ev) {
    if (ev.arg_name.empty()) return;
    if (ev.name == "process_name") out_.process_names[ev.pid] = out_.names.intern(ev.arg_name);
    else if (ev.name == "thread_name") out_.thread_names[thread_key(ev.pid, ev.tid)] = out_.names.intern(ev.arg_name);
  }

 private:
  CollectedTrace& out_;
  int64_t last_pid_ = 0, last_tid_ = 0;
  uint32_t last_thread_ = 0;
  bool have_last_ = false;
};

class Driver {
 public:
  Driver(const std::string& path, const ProgressFn& progress, CollectedTrace& out)
      : path_(path), progress_(progress), out_(out), sc_(path), collector_(out) {}

  void run() {
    const int c = sc_.peek();
    if (c < 0) sc_.fail("empty file: not a trace");
    if (c == '{') {
      top_object();
    } else if (c == '[') {
      out_.top_level_array = true;
      const int64_t valid = event_array();
      if (valid == 0 && out_.total_events > 0) sc_.fail("JSON array without trace events: not a trace");
    } else if (c == 0x89) {
      sc_.fail("not a JSON trace: the file starts with byte 0x89 (a PNG image?)");
    } else if (c >= 0x20 && c < 0x7f) {
      sc_.fail(fmt::format("not a JSON trace: the file starts with '{}'", static_cast<char>(c)));
    } else {
      sc_.fail(fmt::format("not a JSON trace: the file starts with byte 0x{:02x}", c));
    }
    out_.bytes = sc_.offset();
    report(true);
  }

 private:
  void report(bool last) {
    if (!progress_) return;
    const uint64_t off = sc_.offset();
    if (!last && off < next_report_) return;
    next_report_ = off + (16u << 20);
    const bool gz = path_.size() > 3 && path_.compare(path_.size() - 3, 3, ".gz") == 0;
    progress_(path_, last ? sc_.file_size() : gz ? sc_.compressed_offset() : off, sc_.file_size());
  }

  void top_object() {
    sc_.expect('{', "'{'");
    std::string key, tmp;
    if (!sc_.accept('}')) {
      do {
        sc_.read_string(key);
        sc_.expect(':', "':'");
        if (key == "traceEvents") {
          if (sc_.peek() != '[') sc_.fail("\"traceEvents\" is not an array");
          out_.has_trace_events = true;
          event_array();
        } else if (key == "deviceProperties" && sc_.peek() == '[') {
          // Kineto lists the GPUs here, before traceEvents: a run with devices keeps no CPU operators
          // (CollectedTrace::cpu_ops), so its CPU-side events never cost memory.
          sc_.expect('[', "'['");
          if (!sc_.accept(']')) {
            out_.seen_device = true;
            do sc_.skip_value();
            while (sc_.accept(','));
            sc_.expect(']', "']' or ','");
          }
        } else if (key == "distributedInfo" && sc_.peek() == '{') {
          out_.has_distributed_info = true;
          sc_.expect('{', "'{'");
          if (!sc_.accept('}')) {
            do {
              sc_.read_string(tmp);
              sc_.expect(':', "':'");
              NumberText n;
              int64_t v = 0;
              if (tmp == "rank") {
                if (sc_.read_number(n) && number_to_int(n, v) && v >= 0 && v < (1 << 30)) out_.dist_rank = static_cast<int>(v);
              } else {
                sc_.skip_value();
              }
            } while (sc_.accept(','));
            sc_.expect('}', "'}' or ','");
          }
        } else if (key == "otherData" && sc_.peek() == '{') {
          sc_.expect('{', "'{'");
          if (!sc_.accept('}')) {
            do {
              sc_.read_string(tmp);
              sc_.expect(':', "':'");
              NumberText n;
              int64_t v = 0;
              if (tmp == "producer" && sc_.peek() == '"') {
                sc_.read_string(tmp);
                out_.coc_producer = tmp == "coc";
              } else if (tmp == "world_size") {
                if (sc_.read_number(n) && number_to_int(n, v) && v >= 1 && v < (int64_t{1} << 30)) out_.world_size = v;
              } else if (tmp == "pipeline_model_parallel_size" || tmp == "num_microbatches" ||
                         tmp == "num_virtual_stages_per_pipeline_rank") {
                // coc's run metadata (analysis/trace_writer.h, TraceMeta): P, M and V, for the ideal bubble.
                int64_t& field = tmp == "pipeline_model_parallel_size" ? out_.pp_stages
                                 : tmp == "num_microbatches"            ? out_.pp_micro_batches
                                                                        : out_.pp_virtual_stages;
                if (sc_.read_number(n) && number_to_int(n, v) && v >= 1 && v < (int64_t{1} << 30)) field = v;
              } else {
                sc_.skip_value();
              }
            } while (sc_.accept(','));
            sc_.expect('}', "'}' or ','");
          }
        } else {
          // displayTimeUnit does not change the unit of ts, which stays µs (edge case 28): ignored on purpose.
          sc_.skip_value();
        }
      } while (sc_.accept(','));
      sc_.expect('}', "'}' or ','");
    }
    if (!out_.has_trace_events) sc_.fail("no \"traceEvents\" array: JSON, but not a Chrome/Kineto/coc trace");
  }

  // Returns the number of elements that were event objects.
  int64_t event_array() {
    sc_.expect('[', "'['");
    int64_t objects = 0;
    if (sc_.accept(']')) return 0;
    RawEvent ev;
    for (;;) {
      const int c = sc_.peek();
      if (c == '{') {
        bool ok = true;
        try {
          read_event(sc_, ev);
        } catch (const ParseError&) {
          if (sc_.peek() < 0) throw;
          // A structure error inside one event (e.g. an unescaped quote in a name): skip to the next event.
          ++out_.total_events;
          ++out_.malformed_events;
          sc_.resync_event();
          ok = false;
        }
        if (ok) {
          ++objects;
          collector_.on_event(ev);
        } else if (sc_.peek() == '{') {
          continue;  // resynchronised on the next event
        }
      } else if (c < 0) {
        sc_.fail("unexpected end of input inside the event array");
      } else {
        ++out_.total_events;
        ++out_.malformed_events;
        sc_.skip_value();
      }
      report(false);
      if (sc_.accept(',')) {
        if (sc_.peek() == ']') {  // trailing comma: tolerated
          sc_.expect(']', "']'");
          return objects;
        }
        continue;
      }
      sc_.expect(']', "',' or ']' after an event");
      return objects;
    }
  }

  const std::string& path_;
  const ProgressFn& progress_;
  CollectedTrace& out_;
  JsonScanner sc_;
  Collector collector_;
  uint64_t next_report_ = 16u << 20;
};

}  // namespace

uint32_t NameTable::intern(std::string_view s) {
  auto it = ids_.find(s);
  if (it != ids_.end()) return it->second;
  const uint32_t id = static_cast<uint32_t>(names_.size());
  names_.emplace_back(s);
  ids_.emplace(std::string(s), id);
  return id;
}

CollectedTrace collect_trace(const std::string& path, const ProgressFn& progress) {
  CollectedTrace out;
  out.names.intern("");  // id 0 = no name
  Driver d(path, progress, out);
  d.run();
  return out;
}

}  // namespace coc::analysis::detail
