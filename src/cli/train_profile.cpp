#include "cli/train_profile.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "coc/analysis/analyze.h"
#include "coc/analysis/trace_writer.h"
#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/runtime/tracer.h"

namespace coc::cli {

void add_profile_flags(CLI::App* cmd, ProfileOptions& o) {
  cmd->add_flag("--profile", o.on,
                "Record a trace of the profiled steps: Chrome trace-event JSON for Perfetto / chrome://tracing, one "
                "file for all ranks, with an Overlap Analysis lane per rank (docs/profiling.md)");
  auto& w = o.window_options;
  w.push_back(cmd->add_option("--profile-step-start", o.step_start, "First profiled iteration (0-based)")
                  ->capture_default_str());
  w.push_back(cmd->add_option("--profile-step-end", o.step_end,
                              "First iteration not profiled (0-based; -1 = profile to the last iteration)")
                  ->capture_default_str());
  w.push_back(cmd->add_option("--profile-ranks", o.ranks, "World ranks to profile, e.g. '0 1' or '0,1' (-1 = all)")
                  ->delimiter(',')
                  ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
                  ->capture_default_str());
  w.push_back(cmd->add_option("--profile-level", o.level,
                              "level0: steps, layers, collectives and GEMMs; level1: also every kernel, CoC op and "
                              "wait")
                  ->capture_default_str());
  w.push_back(cmd->add_option("--profile-dir,--profile-save-path", o.dir,
                              "Directory of the trace file (created if missing; --profile-save-path: MindSpeed's name)")
                  ->capture_default_str());
}

namespace {

/// Rank 0 creates the directory and writes a probe file; the outcome is broadcast so every rank raises the same
/// uniform error at start-up instead of rank 0 failing after the whole run.
void check_profile_dir(Communicator& world, const std::string& dir) {
  std::string err;
  if (world.rank() == 0) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec || !std::filesystem::is_directory(dir)) {
      err = fmt::format("--profile-dir {}: cannot create the directory ({}); pass a writable directory", dir,
                        ec ? ec.message() : "a file of that name exists");
    } else {
      const std::string probe = fmt::format("{}/.coc-profile-write-test", dir);
      std::FILE* f = std::fopen(probe.c_str(), "w");
      if (!f) err = fmt::format("--profile-dir {}: the directory is not writable; pass a writable directory", dir);
      else std::fclose(f);
      std::remove(probe.c_str());
    }
  }
  err = world.broadcast_string(std::move(err), 0, "profile dir check");
  if (!err.empty()) throw_invalid("{}", err);
}

}  // namespace

TrainProfiler::TrainProfiler(const ProfileOptions& o, const CommOptions& copts, TrainConfig& cfg) : o_(o) {
  engine_ = std::make_shared<ProgressEngine>(EngineKind::kInline, copts.poll_us);
  world_ = Communicator::world("profile", engine_, copts);
  // Ranks that disagree on --profile would disagree on the collectives below: refuse before any of them.
  const std::string key = fmt::format("{}|{}|{}|{}|{}|{}", o.on, o.step_start, o.step_end, fmt::join(o.ranks, ","),
                                      o.level, o.dir);
  world_->check_same(fnv1a(key.data(), key.size()), "the --profile flags");
  if (!o.on) {
    for (const CLI::Option* opt : o.window_options)
      if (opt->count() > 0)
        throw_invalid("{} is given but --profile is not: nothing would be profiled; add --profile, or drop it",
                      opt->get_name());
    return;
  }
  const int P = world_->size(), me = world_->rank();
  const trace::Level level = trace::parse_level(o.level);
  if (o.step_start < 0)
    throw_invalid("--profile-step-start must be >= 0 (got {}); iterations are counted from 0", o.step_start);
  if (o.step_end < -1)
    throw_invalid("--profile-step-end must be -1 (to the last iteration) or > --profile-step-start (got {})",
                  o.step_end);
  if (o.step_end != -1 && o.step_end <= o.step_start)
    throw_invalid("--profile-step-end {} must be greater than --profile-step-start {} (iterations [start, end) are "
                  "profiled); use -1 to profile to the last iteration",
                  o.step_end, o.step_start);
  if (o.step_start >= cfg.train_iters)
    throw_invalid("--profile-step-start {} is not below --train-iters {}: no step would be profiled and the trace "
                  "would be empty; lower --profile-step-start (iterations are counted from 0)",
                  o.step_start, cfg.train_iters);
  if (o.ranks.empty()) throw_invalid("--profile-ranks needs at least one rank (-1 = all)");
  for (int r : o.ranks) {
    if (r == -1) {
      ranks_.clear();
      for (int i = 0; i < P; ++i) ranks_.push_back(i);
      break;
    }
    if (r < 0 || r >= P)
      throw_invalid("--profile-ranks {}: rank out of range for a world of {} ranks; use ranks 0..{} or -1 for all",
                    r, P, P - 1);
    ranks_.push_back(r);
  }
  std::sort(ranks_.begin(), ranks_.end());
  ranks_.erase(std::unique(ranks_.begin(), ranks_.end()), ranks_.end());
  check_profile_dir(*world_, o.dir);
  clocks_ = measure_clock_offsets(*world_);
  const bool mine = std::binary_search(ranks_.begin(), ranks_.end(), me);
  cfg.profile_level = mine ? level : trace::Level::kOff;
  cfg.profiling = true;
  sizes_ = {.tp = cfg.tensor_model_parallel_size, .cp = cfg.context_parallel_size,
            .ep = cfg.expert_model_parallel_size, .pp = cfg.pipeline_model_parallel_size};
  global_batch_ = cfg.global_batch_size;
  micro_batch_ = cfg.micro_batch_size;
  virtual_stages_ = cfg.pipeline_split.virtual_stages;
  cfg.profile_step_start = o.step_start;
  cfg.profile_step_end = o.step_end;
  trace::clear();
  // ~2.6·10^3 events per level1 step and rank of the default model; 2^18 records (~50 MB) cover ~100 steps without
  // allocating inside one. Larger runs allocate further blocks as they fill (one per 4096 events).
  if (mine) trace::reserve(uint64_t{1} << 18);
}

TrainProfiler::~TrainProfiler() { trace::set_level(trace::Level::kOff); }

namespace {
// Rank 0, after writing a trace of several ranks: the cross-rank figures `coc analyze` would print (docs/analysis.md,
// "Waiting for a later rank", and the compute balance), so that a rank's "not overlapped" share is read with them.
// Reads the file back; a failure only costs this line.
void log_cross_rank(const std::string& path) {
  try {
    analysis::AnalyzeOptions opt;
    opt.threads = 1;
    const analysis::Report rep = analysis::analyze_paths({path}, opt);
    std::string waits;
    for (const analysis::RankReport& r : rep.ranks) {
      const analysis::StepReport& t = r.total;
      if (t.late_wait_ns < 0 || t.split.window <= 0) return;  // nothing to match (an older format, one rank)
      waits += fmt::format("{}rank {} {:.1f}%", waits.empty() ? "" : ", ", r.rank,
                           100.0 * static_cast<double>(t.late_wait_ns) / static_cast<double>(t.split.window));
    }
    const int64_t lo = rep.least_compute_ns, hi = rep.most_compute_ns;
    log::info("profile: waiting for a later rank to post (part of not overlapped, % of the steps): {}; computing "
              "{:.3f} ms (rank {}) to {:.3f} ms (rank {}), spread {:.1f}%{} (`coc analyze {}` has the details)",
              waits, static_cast<double>(lo) / 1e6, rep.least_compute_rank, static_cast<double>(hi) / 1e6,
              rep.most_compute_rank, lo > 0 ? 100.0 * static_cast<double>(hi - lo) / static_cast<double>(lo) : 0.0,
              rep.unequal_compute ? ": unequal ranks" : "", path);
  } catch (const std::exception& e) {
    log::warn("profile: could not read the trace back for its cross-rank figures: {}", e.what());
  }
}
}  // namespace

void TrainProfiler::finish() {
  if (!o_.on) return;
  trace::set_level(trace::Level::kOff);
  uint64_t dropped = 0;
  std::vector<trace::Record> records = trace::collect(&dropped);
  analysis::TraceMeta meta;
  meta.world_size = world_->size();
  meta.ranks = ranks_;
  meta.clock_offsets_ns = clocks_.offset_ns;
  meta.clock_rtt_ns = clocks_.rtt_ns;
  meta.level = o_.level;
  meta.step_start = o_.step_start;
  meta.step_end = o_.step_end;
  meta.dropped_events = dropped;
  // P and M as the trainer computes them (model/trainer.cpp): training has validated the sizes by now.
  meta.pipeline_stages = sizes_.pp;
  meta.micro_batches = global_batch_ / (micro_batch_ * mesh_dense_dp(world_->size(), sizes_));
  meta.virtual_stages = virtual_stages_;
  if (dropped > 0)
    log::warn("--profile: {} events were dropped (the per-process cap of the tracer was reached); profile fewer "
              "steps or use --profile-level level0",
              dropped);
  analysis::MergedTraceResult r = analysis::write_merged_trace(*world_, std::move(records), meta, o_.dir);
  trace::clear();
  if (world_->rank() == 0) log::info("profile: trace written to {} (open it in https://ui.perfetto.dev)", r.path);
  if (r.profiled) {
    // The one-line form of Ascend's Overlap Analysis (docs/semantics.md §7): shares of the profiled steps' time.
    const analysis::OverlapBreakdown& b = r.overlap;
    auto pct = [&](int64_t v) {
      return b.window > 0 ? 100.0 * static_cast<double>(v) / static_cast<double>(b.window) : 0.0;
    };
    // Free splits into the traced host work (data, logging, checkpoint) and idle time.
    log::info("profile: {} step{}, {:.3f} ms: computing {:.1f}%, communication {:.1f}% (not overlapped {:.1f}%), "
              "free {:.1f}% (host work {:.1f}%, idle {:.1f}%), comm/comp overlap {:.1f}%",
              r.steps, r.steps == 1 ? "" : "s", static_cast<double>(b.window) / 1e6, pct(b.computing),
              pct(b.communication), pct(b.exposed), pct(b.free), pct(r.host_work_free),
              pct(b.free - r.host_work_free), b.overlap_pct());
    // The steady state, without the steps that hold auto's timing (trace::kAutoTimingEvent).
    if (!r.auto_timing_steps.empty()) {
      const std::string which = fmt::format("{}", fmt::join(r.auto_timing_steps, ", "));
      const analysis::OverlapBreakdown& s = r.steady;
      const int n = r.steps - static_cast<int>(r.auto_timing_steps.size());
      auto spct = [&](int64_t v) { return 100.0 * static_cast<double>(v) / static_cast<double>(s.window); };
      if (n > 0) {
        if (s.window > 0)
          log::info("profile: without {} (--coc-parallel-num auto timed its candidates there, once per shape): {} "
                    "step{}, {:.3f} ms: computing {:.1f}%, communication {:.1f}% (not overlapped {:.1f}%), free "
                    "{:.1f}%, comm/comp overlap {:.1f}%",
                    which, n, n == 1 ? "" : "s", static_cast<double>(s.window) / 1e6, spct(s.computing),
                    spct(s.communication), spct(s.exposed), spct(s.free), s.overlap_pct());
      } else {
        log::info("profile: --coc-parallel-num auto timed its candidates in {}, every profiled step: profile later "
                  "steps (--profile-step-start) or reuse a --coc-tuning-cache for the steady state",
                  which);
      }
    }
  }
  if (world_->rank() == 0 && r.profiled && world_->size() > 1) log_cross_rank(r.path);
}

}  // namespace coc::cli
