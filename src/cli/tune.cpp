// `coc tune` (tune.h, docs/tune.md): measure, profile, one switch at a time against the current best in one
// alternating run each, confirm against the starting point, write the YAML, the report and --json.
#include "cli/tune.h"

#include <malloc.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/alternating.h"
#include "cli/bench_common.h"
#include "cli/commands.h"
#include "cli/train_profile.h"
#include "cli/tune_report.h"
#include "coc/analysis/report_text.h"
#include "coc/analysis/analyze.h"
#include "coc/comm/progress_engine.h"
#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/core/median.h"
#include "coc/core/progress_bar.h"
#include "coc/kernels/gemm.h"
#include "coc/runtime/memory.h"

namespace coc::cli {

using nlohmann::json;
using Keys = std::vector<std::pair<std::string, std::string>>;
using Clock = std::chrono::steady_clock;

namespace {

/// `base` with `keys` applied as `coc train --config` applies YAML keys (the same parser, so a key means here what
/// it means in the YAML written at the end). Throws a uniform kInvalidArgument error for a value the flag refuses.
TrainOptions apply_keys(const TrainOptions& base, const Keys& keys) {
  TrainOptions o = base;
  o.mindspeed.kernel_flags.clear();  // they point into the command's parser
  CLI::App app("tune candidate");
  add_train_flags(&app, o);
  for (const auto& [key, value] : keys) {
    CLI::Option* opt = app.get_option_no_throw("--" + key);
    if (!opt) throw_invalid("coc tune: --{}: not a coc train flag", key);
    try {
      opt->clear();
      opt->add_result(value);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      throw_invalid("coc tune: --{} {}: {}", key, value, e.what());
    }
  }
  return o;
}

/// A measuring run of `c`: --tune-iters iterations, nothing saved, loaded, evaluated, sampled or printed per
/// iteration; the user's --train-iters and the rest stay in the YAML.
TrainConfig measuring(TrainConfig c, int64_t iters) {
  c.train_iters = iters;
  c.sample_length = 0;
  c.quiet = true;
  c.progress_bar = false;
  c.save.clear();
  c.load.clear();
  c.eval_interval = c.eval_iters = 0;
  c.skip_train = false;
  c.logits_out.clear();
  c.exit_interval = 0;
  c.exit_duration_mins = 0;
  c.on_iteration = nullptr;
  c.on_evaluation = nullptr;
  c.baseline = nullptr;
  return c;
}

/// Hands the freed heap back and restarts the kernel's high-water mark (VmHWM) at the current RSS, so that the next
/// run's peak is its own and not an earlier run's (/proc/PID/clear_refs "5", Linux >= 4.0). Returns false where the
/// kernel refuses; the peaks are then the process's since start.
bool reset_peak_rss() {
  malloc_trim(0);
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

/// Each world rank's node, as the lowest world rank on it. Collective over MPI_COMM_WORLD.
std::vector<int> node_leaders() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int me = 0, leader = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Allreduce(&me, &leader, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  std::vector<int> leaders(static_cast<size_t>(world));
  MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD);
  return leaders;
}

/// Every tp group's ranks share a node (tp ranks are adjacent in the mesh): the fused kernel's shared window works.
bool tp_inside_node(const std::vector<int>& leaders, int tp) {
  for (size_t r = 0; r < leaders.size(); ++r)
    if (tp > 0 && leaders[r] != leaders[r - r % static_cast<size_t>(tp)]) return false;
  return true;
}

/// Pairs of whole runs for a switch that cannot change between iterations (alternate_whole_runs).
constexpr int kWholeRounds = 2;

/// The state of one tune run on every rank (identical everywhere: every decision reads figures that are the same
/// on all ranks: the iteration times are maxima over ranks, memory and clocks are reduced before use).
class Tuner {
 public:
  Tuner(const TuneOptions& o, Communicator& world, const CommOptions& copts)
      : o_(o), world_(world), copts_(copts), t0_(Clock::now()), best_copts_(copts) {}

  ~Tuner() {
    std::error_code ec;
    if (!work_dir_.empty() && world_.rank() == 0) std::filesystem::remove_all(work_dir_, ec);
  }
  TuneResult run();

 private:
  std::vector<int> leaders_;  ///< node_leaders(), for tp_inside_node at each layout
  double best_peak_mib_ = -1;  ///< the best's peak RSS (MiB per rank); < 0: not measured (--budget 0)
  double elapsed() { return world_.all_reduce_value(std::chrono::duration<double>(Clock::now() - t0_).count(),
                                                     ReduceOp::kMax, "tune clock"); }
  double budget_s() const { return o_.budget_minutes * 60; }
  /// A candidate's run time in units of one alternating run (estimate_s_): whole runs take kWholeRounds pairs.
  static double cost(const Candidate& c) { return c.whole_run ? 2.0 * kWholeRounds : 1.0; }
  /// The confirmation compares whole runs when a kept key cannot switch between iterations.
  bool whole_confirm() const { return needs_whole_runs(chosen_); }
  /// Keys the trainer cannot switch between iterations. A pipelined run alternates like any other (every stage
  /// switches at the same iteration boundary; --overlap-p2p-communication is switchable).
  bool needs_whole_runs(const Keys& keys) const {
    return std::any_of(keys.begin(), keys.end(), [](const auto& k) { return !is_switchable("--" + k.first); });
  }
  double confirm_cost() const { return whole_confirm() ? 2.0 * kWholeRounds : 1.0; }
  bool over_limit(double peak_mib) const { return o_.memory_limit_mib > 0 && peak_mib > o_.memory_limit_mib; }
  /// The keys of the best with `keys` applied over them (a key the best sets is replaced).
  Keys merged(const Keys& keys) const {
    Keys m = chosen_;
    for (const auto& kv : keys) {
      std::erase_if(m, [&](const auto& k) { return k.first == kv.first; });
      m.push_back(kv);
    }
    return m;
  }
  std::string refusal(const Candidate& c) const;
  std::string current_layout() const;
  void refresh_context();
  TrainConfig prepared(TrainConfig c) const {
    c = measuring(std::move(c), o_.tune_iters);
    c.coc_tuning_cache = cache_;
    // train() leaves the process on the last run's GEMM library, and a config without --gemm-backend takes the
    // process's: pin the starting one, so that a tried --gemm-backend does not leak into the runs after it.
    if (!c.gemm_backend) c.gemm_backend = process_backend_;
    return c;
  }
  TrainResult run_profiled(TrainConfig c, const CommOptions& copts, const std::string& dir);
  void measure_baseline(TuneResult& res);
  void verify(TuneResult& res);
  /// The verifying profile's share of a measuring run's time: warm-up plus two profiled iterations of --tune-iters,
  /// counted as at least half a run for the start-up and the trace's analysis; 0 without a profile.
  double verify_cost() const {
    if (profile_dir_.empty()) return 0;
    return std::max(0.5, static_cast<double>(2 * o_.skip_pairs + 2) / static_cast<double>(o_.tune_iters));
  }
  void measure_one(TuneResult& res);
  /// Issue 36's step 2 over `res.order`, then, after a kept layout, once more over the families before it.
  void walk(TuneResult& res);
  /// One switch at a time over `families` (family, communicator), each against the current best. `again`: a second
  /// walk, which records no skipped family (the first walk said why).
  void walk_families(TuneResult& res, const std::vector<std::pair<std::string, std::string>>& families, bool again);
  void second_look(TuneResult& res);
  void try_candidate(TuneResult& res, Candidate c);
  void confirm(TuneResult& res);
  void progress(const std::string& line) {
    if (world_.rank() != 0) return;
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

  const TuneOptions& o_;
  Communicator& world_;
  CommOptions copts_;
  Clock::time_point t0_;
  bool stdout_tty_ = false;
  TrainConfig start_, best_;
  CommOptions best_copts_;  ///< the best's communicator options (--comm-engine, --comm-nonblocking-impl)
  Keys chosen_;
  double best_ms_ = 0;
  double estimate_s_ = 0;  ///< the longest measuring run so far: what the next one is expected to take
  bool out_of_budget_ = false;
  bool test_kept_ = false;  ///< --test-keep has kept its candidate
  SwitchContext ctx_;
  std::string work_dir_;     ///< rank 0's temporary folder (removed by ~Tuner)
  std::string cache_;        ///< the --coc-tuning-cache of every measuring run
  std::string profile_dir_;  ///< where the traces go; empty: --no-profile
  GemmBackend process_backend_ = gemm_backend();  ///< the process's GEMM library when tune started
};

/// Rank 0 makes a private folder under /tmp (the profiles, and the tuning cache when none is given); every rank gets
/// its name. Throws a uniform error when it cannot.
std::string make_work_dir(Communicator& world) {
  std::string dir;
  if (world.rank() == 0) {
    char tmpl[] = "/tmp/coc-tune.XXXXXX";
    if (mkdtemp(tmpl)) dir = tmpl;
  }
  dir = world.broadcast_string(dir, 0, "tune work dir");
  if (dir.empty()) throw_invalid("coc tune: cannot create a temporary folder in /tmp; check that /tmp is writable");
  return dir;
}

/// The verdicts (analysis::verdict_of: exposed communication <= 10% ok, free < 3% ok) and shares of one rank.
json rank_health(const analysis::RankReport& rr) {
  const analysis::OverlapBreakdown& b = rr.total.split;
  const double w = static_cast<double>(b.window);
  const analysis::Verdict v = analysis::verdict_of(rr.total);
  return {{"rank", rr.rank}, {"exposed_pct", w > 0 ? 100.0 * static_cast<double>(b.exposed) / w : 0.0},
          {"free_pct", w > 0 ? 100.0 * static_cast<double>(b.free) / w : 0.0}, {"exposed", v.exposed},
          {"free", v.free}};
}

/// What the Free time of a rank was: coc analyze's explanation (traced host work, idle time, the longest gaps and
/// the events around them), or the launch evidence where the trace traced no host work.
std::string host_bound_evidence(const analysis::RankReport& rr) {
  std::string e = analysis::report::free_explanation(rr);
  if (!e.empty()) return e;
  const analysis::StepReport& t = rr.total;
  return fmt::format("device idle {:.1f} ms; {} idle gap(s) ended by a late launch ({:.1f} ms)",
                     static_cast<double>(t.split.free) / 1e6, t.idle_gaps, static_cast<double>(t.idle_gap_ns) / 1e6);
}

/// The newest coc trace in `dir` (the profiler writes one merged file per profiled run).
std::string newest_trace(const std::string& dir) {
  std::string path;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json" && e.path().filename().string().rfind("coc_trace_", 0) == 0 &&
        (path.empty() || e.path().string() > path))
      path = e.path().string();
  return path;
}

/// coc analyze's figures of one trace as tune reads them: "comm" (exposed ms per communicator family, summed over
/// ranks: what orders the switches), "communicators" (each communicator by its full name, exposed and total ms
/// summed over ranks, largest exposure first), "ranks" (each rank's verdicts), "verdict" (the rank with the most
/// exposed communication), "host_bound" (the rank with the most free time and what that time was), "healthy".
json analyse_reports(const std::vector<analysis::RankReport>& reports) {
  json j = {{"comm", json::object()}, {"communicators", json::array()}, {"ops", json::array()},
            {"ranks", json::array()}};
  std::map<std::string, std::pair<double, double>> groups;  // name -> (exposed ms, communication ms)
  std::map<std::string, std::pair<double, double>> ops;     // "op collective" -> the same, summed over ranks
  double worst = -1, most_free = -1;
  bool healthy = true;
  for (const analysis::RankReport& rr : reports) {
    for (const analysis::CommGroupStat& g : rr.comm_groups) {
      const std::string key = g.name.rfind("fsdp", 0) == 0 ? "fsdp" : g.name.substr(0, g.name.find_first_of(" -"));
      j["comm"][key] = j["comm"].value(key, 0.0) + static_cast<double>(g.exposed_ns) / 1e6;
      groups[g.name].first += static_cast<double>(g.exposed_ns) / 1e6;
      groups[g.name].second += static_cast<double>(g.communication_ns) / 1e6;
    }
    for (const analysis::CommOpStat& o : rr.comm_ops) {
      const std::string key = (o.op.empty() ? std::string("(untagged)") : o.op) + ' ' + o.collective;
      ops[key].first += static_cast<double>(o.exposed_ns) / 1e6;
      ops[key].second += static_cast<double>(o.communication_ns) / 1e6;
    }
    if (rr.total.split.window <= 0) continue;
    const json h = rank_health(rr);
    j["ranks"].push_back(h);
    healthy = healthy && h["exposed"] == "ok" && h["free"] == "ok";
    if (h["exposed_pct"].get<double>() > worst) worst = h["exposed_pct"].get<double>(), j["verdict"] = h;
    if (h["free_pct"].get<double>() > most_free) {
      most_free = h["free_pct"].get<double>();
      j["host_bound"] = {{"rank", rr.rank}, {"free_pct", most_free}, {"free", h["free"]},
                         {"evidence", host_bound_evidence(rr)}};
    }
  }
  std::vector<std::pair<std::string, std::pair<double, double>>> sorted(groups.begin(), groups.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  for (const auto& [name, ms] : sorted)
    j["communicators"].push_back({{"name", name}, {"exposed_ms", ms.first}, {"communication_ms", ms.second}});
  sorted.assign(ops.begin(), ops.end());  // the operations behind the exposure (coc analyze's per-op rows)
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  for (const auto& [name, ms] : sorted)
    j["ops"].push_back({{"op", name}, {"exposed_ms", ms.first}, {"communication_ms", ms.second}});
  j["healthy"] = healthy && !j["ranks"].empty();
  return j;
}

/// Rank 0 analyses the newest trace in `dir` with coc analyze's code (analyse_reports); every rank gets the same
/// JSON, or {"error": "..."} when the trace cannot be read.
json analyse_trace(Communicator& world, const std::string& dir) {
  std::string text;
  if (world.rank() == 0) {
    json j;
    try {
      j = analyse_reports(analysis::analyze_file(newest_trace(dir), {}));
    } catch (const std::exception& e) {
      j = {{"error", e.what()}};
    }
    text = j.dump();
  }
  return json::parse(world.broadcast_string(text, 0, "tune profile"));
}

/// "exposed communication 12.0% (watch), free 1.0% (ok) on rank 1; exposed per communicator: tp 3.1 ms, ..."
std::string profile_line(const json& j) {
  if (j.contains("error")) return "profile not analysed (" + j["error"].get<std::string>() + ")";
  std::vector<std::pair<std::string, double>> comm;
  for (const auto& [name, ms] : j["comm"].items()) comm.emplace_back(name, ms.get<double>());
  std::sort(comm.begin(), comm.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string line;
  if (j.contains("verdict"))
    line = fmt::format("exposed communication {:.1f}% ({}), free {:.1f}% ({}) on rank {}",
                       j["verdict"]["exposed_pct"].get<double>(), j["verdict"]["exposed"].get<std::string>(),
                       j["verdict"]["free_pct"].get<double>(), j["verdict"]["free"].get<std::string>(),
                       j["verdict"]["rank"].get<int>());
  std::string per;
  for (const auto& [name, ms] : comm) per += fmt::format("{}{} {:.1f} ms", per.empty() ? "" : ", ", name, ms);
  if (!per.empty()) line += (line.empty() ? "" : "; ") + std::string("exposed per communicator (all ranks): ") + per;
  std::string top;  // where to look next: the three most exposed operations
  const json ops = j.value("ops", json::array());
  for (size_t i = 0; i < std::min<size_t>(3, ops.size()); ++i)
    if (const json& o = ops[i]; o["exposed_ms"].get<double>() > 0)
      top += fmt::format("{}{} {:.1f} ms", top.empty() ? "" : ", ", o["op"].get<std::string>(),
                         o["exposed_ms"].get<double>());
  if (!top.empty()) line += "; most exposed operations: " + top;
  return line;
}

/// Trains `c` for its iterations plus two profiled ones (when `dir` is set) and returns the log; the profile's
/// trace goes to `dir`. The profiler's summary lines are left to the report unless -v.
TrainResult Tuner::run_profiled(TrainConfig c, const CommOptions& copts, const std::string& dir) {
  ProfileOptions po;
  po.on = !dir.empty();
  po.step_start = c.train_iters;
  po.dir = dir.empty() ? "./profile" : dir;
  if (po.on) c.train_iters += 2;
  const int saved = log::level();
  if (o_.train.verbose == 0) log::set_level(0);
  TrainProfiler profiler(po, copts, c);
  TrainResult r = train(c, copts);
  profiler.finish();
  log::set_level(saved);
  return r;
}

/// The baseline alone: --tune-iters iterations, then two profiled ones (unless --no-profile); its median after
/// --skip-pairs pairs' worth of warm-up, its peak RSS, and the order the profile gives: the families of the most
/// exposed communicator first, the others in the checklist's order.
void Tuner::measure_baseline(TuneResult& res) {
  progress(fmt::format("coc tune: measuring the baseline ({} iterations{})", o_.tune_iters,
                       o_.no_profile ? "" : ", then 2 profiled"));
  res.peak_reset = reset_peak_rss();
  const auto t = Clock::now();
  const TrainResult r = run_profiled(start_, copts_, profile_dir_);
  std::vector<double> ms;
  for (size_t i = static_cast<size_t>(2 * o_.skip_pairs); i < static_cast<size_t>(o_.tune_iters); ++i)
    ms.push_back(r.log[i].elapsed_ms);
  best_ms_ = res.baseline_ms = median(ms);
  res.baseline_peak_mib = world_.all_reduce_value(static_cast<double>(resident_memory().peak_bytes) / (1 << 20),
                                                  ReduceOp::kMax, "tune peak memory");
  best_peak_mib_ = res.baseline_peak_mib;
  estimate_s_ = world_.all_reduce_value(std::chrono::duration<double>(Clock::now() - t).count(), ReduceOp::kMax,
                                        "tune run time");
  if (!profile_dir_.empty()) {
    res.profile = analyse_trace(world_, profile_dir_);
    res.profile_line = "profile: " + profile_line(res.profile);
    if (res.profile.contains("comm")) {
      const json& comm = res.profile["comm"];
      std::stable_sort(res.order.begin(), res.order.end(), [&](const auto& a, const auto& b) {
        return comm.value(a.second, 0.0) > comm.value(b.second, 0.0);
      });
    }
  }
  progress(fmt::format("coc tune: baseline {:.1f} ms per iteration (median of {}), peak RSS {:.0f} MiB per rank{}",
                       res.baseline_ms, ms.size(), res.baseline_peak_mib,
                       res.profile_line.empty() ? "" : "; " + res.profile_line));
}

/// Issue 36's step 3: the chosen configuration's own profile, as the baseline's was taken and analysed: its health
/// verdicts, what is still exposed on which communicator, the host-bound evidence. When no switch was kept (or the
/// confirmation returned the baseline), the chosen configuration is the baseline and its profile is the verdict.
void Tuner::verify(TuneResult& res) {
  const bool baseline = res.chosen.empty();
  res.verify = {{"of", baseline ? "baseline" : "tuned"}};
  if (o_.budget_minutes == 0) {
    res.verify["not_profiled"] = "--budget 0";
    return;
  }
  if (profile_dir_.empty()) {
    res.verify["not_profiled"] = "--no-profile";
    return;
  }
  if (baseline) {
    res.verify["profile"] = res.profile;
    return;
  }
  if (elapsed() + verify_cost() * estimate_s_ > budget_s()) {
    res.verify["not_profiled"] = "the budget ran out";
    return;
  }
  progress(fmt::format("coc tune [{:.0f}/{:.0f} s] verifying: profiling the tuned configuration", elapsed(),
                       budget_s()));
  TrainConfig c = best_;
  c.train_iters = 2 * o_.skip_pairs;  // warm-up, then the two profiled iterations
  run_profiled(c, best_copts_, profile_dir_);
  res.verify["profile"] = analyse_trace(world_, profile_dir_);
  progress("  -> " + profile_line(res.verify["profile"]));
}

/// One candidate against the current best in one alternating run, decided by the memory limit and the keep rule.
void Tuner::try_candidate(TuneResult& res, Candidate c) {
  TuneStep s;
  s.cand = c;
  s.ms_before = best_ms_;
  const Keys keys = merged(c.keys);
  const double at = elapsed();
  progress(fmt::format("coc tune [{:.0f}/{:.0f} s] trying {} against the best ({:.1f} ms){}", at, budget_s(),
                       c.label(), best_ms_, c.whole_run ? fmt::format(", {} pairs of whole runs", kWholeRounds) : ""));
  TrainConfig cand;
  TrainOptions cand_opts;
  CommOptions cand_copts;
  Alternation alt;
  try {
    cand_opts = apply_keys(o_.train, keys);
    cand = prepared(cand_opts.resolve(stdout_tty_));
    cand_copts = cand_opts.comm_options();
    reset_peak_rss();
    const auto t = Clock::now();
    // --candidate measures in a process that has not trained yet (no baseline run): its first run would be cold.
    alt = c.whole_run ? alternate_whole_runs(cand, cand_copts, best_, best_copts_, o_.skip_pairs, kWholeRounds,
                                             [] { reset_peak_rss(); }, /*warm_up=*/!o_.candidate.empty())
                      : alternate(cand, best_, o_.skip_pairs, best_copts_);
    s.seconds = std::chrono::duration<double>(Clock::now() - t).count();
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kInvalidArgument || !e.uniform()) throw;
    s.status = "skipped";
    s.reason = std::string("refused: ") + e.what();
    progress("  -> skipped: " + s.reason);
    res.steps.push_back(s);
    return;
  }
  s.seconds = world_.all_reduce_value(s.seconds, ReduceOp::kMax, "tune run time");
  estimate_s_ = std::max(estimate_s_, s.seconds / cost(c));
  // Whole runs: the candidate's own runs' peak. One alternating run: both sides' (the best was within the limit, or
  // the candidate would run as whole runs: walk()).
  s.peak_mib = world_.all_reduce_value(
      static_cast<double>(c.whole_run ? alt.run_peak_bytes : resident_memory().peak_bytes) / (1 << 20),
      ReduceOp::kMax, "tune peak memory");
  s.ms_before = alt.base_median;
  s.ms_after = alt.run_median;
  s.ratio = alt.ratio_median;
  s.iqr = alt.ratio_iqr;
  s.threshold = keep_threshold(alt.ratio_iqr);
  const bool keep_for_memory = over_limit(best_peak_mib_) && !over_limit(s.peak_mib);
  if (over_limit(s.peak_mib)) {
    s.status = "rejected";
    s.reason = fmt::format("peak RSS {:.0f} MiB per rank exceeds --memory-limit {:.0f} MiB", s.peak_mib,
                           o_.memory_limit_mib);
  } else if (keep_for_memory) {  // the limit comes before speed
    s.status = "kept";
    s.reason = fmt::format("fits in --memory-limit {:.0f} MiB where the best ({:.0f} MiB) did not; pairs {:.3f}x",
                           o_.memory_limit_mib, best_peak_mib_, s.ratio);
  } else if (!o_.test_keep.empty() && c.family == o_.test_keep && !test_kept_) {
    test_kept_ = true;
    s.status = "kept";
    s.reason = fmt::format("--test-keep {}; pairs {:.3f}x", o_.test_keep, s.ratio);
  } else if (alt.ratios.empty()) {
    s.status = "rejected";
    s.reason = "no timed pair";
  } else if (s.ratio > s.threshold) {
    s.status = "kept";
    s.reason = fmt::format("pairs {:.3f}x > {:.3f}", s.ratio, s.threshold);
  } else {
    s.status = "rejected";
    s.reason = fmt::format("not faster beyond the noise: pairs {:.3f}x <= {:.3f}", s.ratio, s.threshold);
  }
  if (s.status == "kept") {
    chosen_ = keys;
    best_ = cand;
    best_copts_ = cand_copts;
    best_ms_ = alt.run_median;
    best_peak_mib_ = s.peak_mib;
    refresh_context();
  }
  progress(fmt::format("  -> {:.1f} -> {:.1f} ms, pairs {:.3f}x (IQR {:.3f}), peak {:.0f} MiB: {} ({})",
                       s.ms_before, s.ms_after, s.ratio, s.iqr, s.peak_mib, s.status, s.reason));
  res.steps.push_back(s);
}

/// The layout-dependent fields of ctx_ from the current best (a kept layout changes them), and its peak.
void Tuner::refresh_context() {
  ctx_.pipeline = std::max(1, best_.pipeline_model_parallel_size);
  ctx_.replicas = std::max(1, ctx_.world / std::max(1, best_.tensor_model_parallel_size * ctx_.pipeline));
  ctx_.tp_inside_node = tp_inside_node(leaders_, best_.tensor_model_parallel_size);
  ctx_.best_peak_mib = best_peak_mib_;
}

/// "tp 2 cp 1 pp 1 dp 1": the current best's layout.
std::string Tuner::current_layout() const {
  const int tp = best_.tensor_model_parallel_size, cp = best_.context_parallel_size,
            pp = best_.pipeline_model_parallel_size;
  return fmt::format("tp {} cp {} pp {} dp {}", tp, cp, pp, world_.size() / std::max(1, tp * cp * pp));
}

/// What coc train says about the best with `c` applied, without running it (validate_train_config): "" when it
/// accepts it, else its one-line error. Collective: the memory check reads each rank's free memory, so the lowest
/// rank that refuses speaks for all, and every rank takes the same decision.
std::string Tuner::refusal(const Candidate& c) const {
  std::string why;
  try {
    validate_train_config(apply_keys(o_.train, merged(c.keys)).resolve(stdout_tty_), world_.size());
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kInvalidArgument || !e.uniform()) throw;
    why = e.what();
  }
  const int64_t first = world_.all_reduce_value<int64_t>(why.empty() ? world_.size() : world_.rank(), ReduceOp::kMin,
                                                         "tune refusal");
  return first == world_.size() ? "" : world_.broadcast_string(why, static_cast<int>(first), "tune refusal");
}

/// --candidate: the one candidate against the run, by the rule a walk's step would use (bench/tune_sweep.sh measures
/// each combination of its sweep so). No baseline run, profile, walk or confirmation.
void Tuner::measure_one(TuneResult& res) {
  Candidate c;
  c.family = "candidate";
  for (size_t at = 0; at <= o_.candidate.size();) {
    const size_t comma = std::min(o_.candidate.find(',', at), o_.candidate.size());
    const std::string kv = o_.candidate.substr(at, comma - at);
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw_invalid("coc tune: --candidate '{}': '{}' is not KEY=VALUE (coc train flag names without the dashes, "
                    "comma-separated: use-mc2=true,coc-parallel-num=4)", o_.candidate, kv);
    c.keys.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    at = comma + 1;
  }
  c.whole_run = needs_whole_runs(c.keys);
  apply_keys(o_.train, c.keys);  // a flag name or value a train run refuses is the caller's typo: one line, exit 2
  try_candidate(res, c);
  if (!res.steps.empty() && res.steps.back().status == "kept") res.chosen = c.keys;
}

void Tuner::walk(TuneResult& res) {
  const std::string start_layout = current_layout();
  walk_families(res, res.order, /*again=*/false);
  if (current_layout() == start_layout || out_of_budget_) return;
  // A kept layout changes what applies (a tp family at tp 2, the FSDP and gradient-reduction families at dp 2) and
  // what pays (other message sizes), so the families before it are walked once more from the new best.
  const auto layout = std::ranges::find(res.order, std::string("layout"), &std::pair<std::string, std::string>::first);
  const std::vector<std::pair<std::string, std::string>> before(res.order.begin(), layout);
  progress(fmt::format("coc tune: the layout is now {} (was {}): the families before it are walked again",
                       current_layout(), start_layout));
  walk_families(res, before, /*again=*/true);
}

/// Each family in order: its candidates one after another while the budget lasts (a candidate starts only when it
/// and the confirmation run, each as long as the longest run so far, fit in what is left).
void Tuner::walk_families(TuneResult& res, const std::vector<std::pair<std::string, std::string>>& families,
                          bool again) {
  for (const auto& [family, comm] : families) {
    if (!o_.families.empty() && std::ranges::find(o_.families, family) == o_.families.end()) {
      if (again) continue;
      TuneStep s;
      s.cand = {family, comm, {}, false};
      s.status = "skipped";
      s.reason = "--" + family + ": not in --families";
      res.steps.push_back(s);
      continue;
    }
    std::vector<Candidate> tried;
    size_t refused = 0;
    for (;;) {
      const NextCandidate n = next_candidate(family, best_, ctx_, tried);
      const bool named = n.skip_reason.rfind("--", 0) == 0 || n.skip_reason.rfind(family + ": ", 0) == 0;
      if (!n.skip_reason.empty()) {
        if (again) break;  // the first walk said why
        TuneStep s;
        s.cand = {family, comm, {}, false};
        s.status = "skipped";
        s.reason = named ? n.skip_reason : "--" + family + ": " + n.skip_reason;
        res.steps.push_back(s);
        break;
      }
      if (n.done) {
        if (refused > 0 && refused == tried.size()) {  // nothing of the family can run: say so once
          TuneStep s;
          s.cand = {family, comm, {}, false};
          s.status = "skipped";
          s.reason = family == "layout"
                         ? fmt::format("layout: coc train refuses every neighbouring layout of {} (the reasons above)",
                                       current_layout())
                         : fmt::format("--{}: coc train refuses every candidate (the reasons above)", family);
          res.steps.push_back(s);
        }
        break;
      }
      Candidate cand = n.cand;
      // While the best exceeds --memory-limit, an alternating run's peak would be the best's too: whole runs read the
      // candidate's own.
      cand.whole_run = needs_whole_runs(cand.keys) || over_limit(best_peak_mib_);
      // What coc train would refuse is skipped with its reason before anything runs (--budget 0 included), so that
      // the next candidate of the family gets its turn.
      if (const std::string why = refusal(cand); !why.empty()) {
        TuneStep s;
        s.cand = cand;
        s.status = "skipped";
        s.reason = "refused: " + why;
        res.steps.push_back(s);
        tried.push_back(cand);
        ++refused;
        continue;
      }
      if (!out_of_budget_ && elapsed() + (cost(cand) + confirm_cost() + verify_cost()) * estimate_s_ > budget_s()) {
        out_of_budget_ = true;
        progress(fmt::format("coc tune: the budget ({:g} min) runs out: the switches left are not tried",
                             o_.budget_minutes));
      }
      if (out_of_budget_) {
        TuneStep s;
        s.cand = cand;
        s.status = "not tried";
        s.reason = o_.budget_minutes == 0 ? "--budget 0" : "the budget ran out";
        res.steps.push_back(s);
        break;
      }
      tried.push_back(cand);
      try_candidate(res, cand);
    }
  }
}

/// After the walk: the rejected switches whose pairs still leaned their way (ratio > 1, under the noise bar), taken
/// together as one candidate against the best, when there are two or more (one alone would only be measured again:
/// a second draw of the same noise). Why: one switch at a time with a noise bar leaves out switches worth 2-5% each
/// whose pairs scatter, and on the shaped cluster their sum was what separated a tune run from the hand-tuned default
/// (docs/performance.md point 33), and one FSDP run from the sweep's best (point 35). Left out: keys a kept step
/// decided since (their family moved on), math changes, memory rejections. One more run (whole runs when one of the
/// switches needs them), within budget.
void Tuner::second_look(TuneResult& res) {
  Candidate c;
  c.family = "second look";
  int switches = 0;
  for (const TuneStep& s : res.steps) {
    if (s.status != "rejected" || s.cand.math_change || s.ratio <= 1.0 || s.reason.rfind("not faster", 0) != 0)
      continue;
    const auto decided = [&](const auto& kv) {
      const auto same_key = [&](const auto& k) { return k.first == kv.first; };
      return std::any_of(chosen_.begin(), chosen_.end(), same_key) ||
             std::any_of(c.keys.begin(), c.keys.end(), same_key);
    };
    if (std::none_of(s.cand.keys.begin(), s.cand.keys.end(), decided)) {
      c.keys.insert(c.keys.end(), s.cand.keys.begin(), s.cand.keys.end());
      ++switches;
    }
  }
  if (switches < 2) return;
  c.whole_run = needs_whole_runs(c.keys);
  if (out_of_budget_ || elapsed() + (cost(c) + confirm_cost() + verify_cost()) * estimate_s_ > budget_s()) {
    TuneStep s;
    s.cand = c;
    s.status = "not tried";
    s.reason = "the budget ran out";
    res.steps.push_back(s);
    return;
  }
  try_candidate(res, c);
}

/// The chosen configuration against the starting point in one alternating run: tune never returns a slower one.
void Tuner::confirm(TuneResult& res) {
  if (chosen_.empty()) return;
  Alternation alt;
  // One switch kept and nothing after it: its own step alternated exactly these two configurations (the best was
  // the start then), so that run is the confirmation rather than a second draw of it (tune's fixed costs weigh most
  // on small sweeps, docs/performance.md point 35).
  const auto kept = [](const TuneStep& s) { return s.status == "kept"; };
  if (std::count_if(res.steps.begin(), res.steps.end(), kept) == 1) {
    const TuneStep& k = *std::find_if(res.steps.begin(), res.steps.end(), kept);
    alt.base_median = k.ms_before;
    alt.run_median = k.ms_after;
    alt.ratio_median = k.ratio;
    alt.ratio_iqr = k.iqr;
    res.confirm_reused = true;
    progress(fmt::format("coc tune [{:.0f}/{:.0f} s] confirmation: the one kept switch's own run against the "
                         "baseline (not run again)", elapsed(), budget_s()));
  } else {
    progress(fmt::format("coc tune [{:.0f}/{:.0f} s] confirming the tuned configuration against the baseline",
                         elapsed(), budget_s()));
    alt = whole_confirm() ? alternate_whole_runs(best_, best_copts_, start_, copts_, o_.skip_pairs, kWholeRounds)
                          : alternate(best_, start_, o_.skip_pairs, copts_);
  }
  res.confirmed = true;
  res.confirm_ms_baseline = alt.base_median;
  res.confirm_ms_tuned = alt.run_median;
  res.confirm_ratio = alt.ratio_median;
  res.confirm_iqr = alt.ratio_iqr;
  if (alt.ratio_median < 1 && over_limit(res.baseline_peak_mib)) {
    progress(fmt::format("  -> slower ({:.3f}x), but the baseline exceeds --memory-limit: the tuned configuration "
                         "stands", alt.ratio_median));
  } else if (alt.ratio_median < 1) {
    res.returned_baseline = true;
    res.chosen.clear();
    progress(fmt::format("  -> the tuned configuration was slower ({:.3f}x): returning the baseline",
                         alt.ratio_median));
  } else {
    progress(fmt::format("  -> {:.1f} -> {:.1f} ms, pairs {:.3f}x (IQR {:.3f})", alt.base_median, alt.run_median,
                         alt.ratio_median, alt.ratio_iqr));
  }
}

TuneResult Tuner::run() {
  TuneResult res;
  res.order = family_order();
  stdout_tty_ = is_terminal(STDOUT_FILENO);
  start_ = best_ = measuring(o_.train.resolve(stdout_tty_), o_.tune_iters);
  ctx_.world = world_.size();
  leaders_ = node_leaders();
  {
    const int tp = start_.tensor_model_parallel_size, cp = start_.context_parallel_size,
              pp = start_.pipeline_model_parallel_size;
    res.layout = {{"world", ctx_.world}, {"tp", tp}, {"cp", cp}, {"pp", pp},
                  {"dp", ctx_.world / std::max(1, tp * cp * pp)}, {"micro_batch_size", start_.micro_batch_size},
                  {"global_batch_size", start_.global_batch_size}};
  }
  ctx_.allow_math_change = o_.allow_math_change;
  ctx_.memory_limit_mib = o_.memory_limit_mib;
  ctx_.start = &start_;
  ctx_.engine = o_.train.engine;
  ctx_.nonblocking_impl = o_.train.nonblocking_impl;
  if (o_.budget_minutes == 0 && o_.candidate.empty()) {  // --candidate measures whatever the budget
    validate_train_config(start_, world_.size());  // nothing runs, so nothing else would refuse a bad run
    out_of_budget_ = true;
    progress("coc tune: --budget 0: the baseline is returned, nothing is measured");
  } else {
    work_dir_ = make_work_dir(world_);
    profile_dir_ = o_.no_profile || !o_.candidate.empty() ? "" : o_.profile_dir.empty() ? work_dir_ : o_.profile_dir;
    // auto's timing paid once: every measuring run shares one tuning cache (the user's, or one of tune's own).
    cache_ = start_.coc_tuning_cache.empty() ? work_dir_ + "/tuning_cache.json" : start_.coc_tuning_cache;
    start_ = best_ = prepared(start_);
    if (o_.candidate.empty()) measure_baseline(res);
  }
  if (over_limit(best_peak_mib_)) {  // recomputation first: nothing else can be kept over the limit but what fits
    const auto rec = std::ranges::find(res.order, std::string("recompute-granularity"),
                                       &std::pair<std::string, std::string>::first);
    std::rotate(res.order.begin(), rec, rec + 1);
  }
  refresh_context();  // the start's layout and its peak (unknown at --budget 0)
  if (!o_.candidate.empty()) {
    measure_one(res);
    res.seconds = elapsed();
    return res;
  }
  walk(res);
  second_look(res);
  res.chosen = chosen_;
  confirm(res);
  verify(res);
  res.seconds = elapsed();
  return res;
}

}  // namespace


CLI::App* add_tune(CLI::App& app, TuneOptions& o) {
  CLI::App* t = app.add_subcommand(
      "tune", "Walk the overlap switches one at a time, each against the current best in one alternating run, and "
              "write the fastest configuration as a YAML for coc train --config (docs/tune.md)");
  // coc train's defaults, so that the YAML trains what `coc train` with the same flags would.
  o.train.cfg.sequence_parallel = true;
  o.train.cfg.train_iters = 300;
  o.train.cfg.optim.lr = 3e-3f;
  o.train.cfg.optim.min_lr = 3e-4f;
  o.train.cfg.optim.weight_decay = 0.1f;
  add_train_flags(t, o.train);
  t->add_option("--budget", o.budget_minutes,
                "Wall-time budget in minutes for everything (a switch starts only when it, the confirmation run and "
                "the verifying profile fit); 0 returns the baseline without measuring")
      ->capture_default_str()
      ->group(kTuneGroup);
  t->add_option("--memory-limit", o.memory_limit_mib,
                "Per-rank peak RSS (MiB) a configuration may reach; a candidate above it is rejected; while the best "
                "exceeds it, recomputation goes first and a candidate that fits is kept (0 = none)")
      ->capture_default_str()
      ->group(kTuneGroup);
  t->add_option("--out", o.out, "The tuned configuration, as a YAML for coc train --config")
      ->capture_default_str()
      ->group(kTuneGroup);
  t->add_option("--json", o.json, "Write every step, the figures and the environment to this JSON file")
      ->group(kTuneGroup);
  t->add_flag("--allow-math-change", o.allow_math_change,
              "Also try switches that are not bitwise equal under --deterministic (--gemm-backend, "
              "--comm-nonblocking-impl, --bf16, --grad-reduce-in-bf16, --cp-window-size, the layout (tp, cp, pp, "
              "dp), --micro-batch-size)")
      ->group(kTuneGroup);
  t->add_option("--tune-iters", o.tune_iters,
                "Iterations of each measuring run (both sides of an alternating run together)")
      ->capture_default_str()
      ->group(kTuneGroup);
  t->add_option("--skip-pairs", o.skip_pairs,
                "Leading iteration pairs of each run left out of the figures (warm-up, auto's timing)")
      ->capture_default_str()
      ->group(kTuneGroup);
  t->add_option("--profile-dir", o.profile_dir,
                "Keep the profiles (Chrome traces) of the baseline and of the tuned configuration in this folder "
                "(default: a temporary folder, removed)")
      ->group(kTuneGroup);
  t->add_flag("--no-profile", o.no_profile,
              "Do not profile the baseline nor the tuned configuration: the switches keep the checklist's order and "
              "the health verdicts are not verified")
      ->group(kTuneGroup);
  t->add_option("--report", o.report_html,
                "Also write a self-contained HTML report: every step's figures and the decision path drawn")
      ->group(kTuneGroup);
  t->add_option("--candidate", o.candidate,
                "Measure only this candidate against the run (KEY=VALUE,... with coc train flag names, e.g. "
                "use-mc2=true,coc-parallel-num=4), as one step of the walk; no baseline run, profile or confirmation "
                "(bench/tune_sweep.sh)")
      ->group(kTuneGroup);
  t->add_option("--families", o.families,
                "Walk only these switch families, comma-separated (names as in the report: coc-parallel-num, use-mc2, "
                "layout, recompute-granularity, ...); the others are skipped (coc's own; bench/tune_sweep.sh --families "
                "sweeps the same ones)")
      ->delimiter(',')
      ->group(kTuneGroup);
  t->add_option("--test-keep", o.test_keep, "Tests only: keep the first candidate of this family that runs")
      ->group("");  // hidden
  return t;
}

Runner add_tune_command(CLI::App& app) {
  auto o = std::make_shared<TuneOptions>();
  CLI::App* cmd = add_tune(app, *o);
  return [o, cmd] { return run_tune(cmd, *o); };
}

namespace {
/// --families names only families tune has: a typo would otherwise skip every switch silently.
void check_families(const std::vector<std::string>& families) {
  std::vector<std::string> known;
  for (const auto& f : family_order()) known.push_back(f.first);
  for (const auto& f : families)
    if (std::ranges::find(known, f) == known.end())
      throw_invalid("coc tune: --families: '{}' is not a switch family; the families are {}", f,
                    fmt::join(known, ", "));
}
}  // namespace

int run_tune(CLI::App* cmd, const TuneOptions& o) {
  if (!o.train.config_path.empty()) apply_yaml_config(cmd, o.train.config_path);
  log::set_level(1 + o.train.verbose);
  set_blas_threads(1);
  if (!(o.budget_minutes >= 0))
    throw_invalid("coc tune: --budget must be >= 0 minutes (got {}); 0 returns the baseline", o.budget_minutes);
  if (!(o.memory_limit_mib >= 0))
    throw_invalid("coc tune: --memory-limit must be >= 0 MiB (got {}); 0 means no limit", o.memory_limit_mib);
  if (o.skip_pairs < 0) throw_invalid("coc tune: --skip-pairs must be >= 0 (got {})", o.skip_pairs);
  if (o.tune_iters < 2 * (o.skip_pairs + 1))
    throw_invalid("coc tune: --tune-iters {} leaves no timed pair after --skip-pairs {}; use --tune-iters {} or more",
                  o.tune_iters, o.skip_pairs, 2 * (o.skip_pairs + 3));
  if (o.out.empty()) throw_invalid("coc tune: --out needs a file name");
  check_families(o.families);
  const CommOptions copts = o.train.comm_options();
  auto engine = std::make_shared<ProgressEngine>(copts.engine, o.train.poll_us);
  const std::unique_ptr<Communicator> world = Communicator::world("tune world", engine, copts);
  bench::check_writable(*world, o.out, "--out");
  if (!o.json.empty()) bench::check_writable(*world, o.json, "--json");
  if (!o.report_html.empty()) bench::check_writable(*world, o.report_html, "--report");
  const json env = bench::environment(*world, 0);
  Tuner tuner(o, *world, copts);
  const TuneResult res = tuner.run();
  if (world->rank() == 0) write_outputs(cmd, o, res, env);
  return 0;
}

}  // namespace coc::cli
