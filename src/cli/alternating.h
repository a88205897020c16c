// Two TrainConfigs timed in one training run, iteration by iteration (TrainConfig::baseline): what `coc bench train`
// prints and what `coc tune` decides on. Shared so that both read the same medians, pairs and spread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "coc/comm/communicator.h"
#include "coc/model/trainer.h"

namespace coc::cli {

/// The flags whose settings the trainer can switch between iterations (TrainConfig::baseline): the CoC schedule,
/// MindSpeed's spellings of it, the backward overlaps, the ring's second communicator, the FSDP prefetch depths,
/// --overlap-grad-reduce, the MoE dispatcher, the fp32 GEMM library, the activation recomputation, --bf16 (the
/// master weights are fp32 either way) and the pipeline's --overlap-p2p-communication. Every other flag builds
/// something once per run.
bool is_switchable(std::string_view flag);
/// The list above, comma-separated, for error messages.
std::string switchable_flags();
/// Why `flag` (with its dashes) cannot differ between the two sides of one run: one clause for messages.
std::string why_not_switchable(const std::string& flag);

/// The outcome of one alternating run. Times are ms per iteration (IterationLog::elapsed_ms, the max over ranks, so
/// every rank holds the same numbers and takes the same decision).
struct Alternation {
  TrainResult result;                ///< every iteration, both sides (IterationLog::baseline says which)
  std::vector<double> base_ms, run_ms;  ///< the timed iterations of each side, in order
  /// Per timed pair (baseline iteration, then the run's): baseline ms / run ms; > 1 = the run's side is faster.
  std::vector<double> ratios;
  double base_median = 0, run_median = 0;
  double ratio_median = 0;  ///< the median of `ratios`
  double ratio_iqr = 0;     ///< their interquartile range (linear interpolation; 0 for fewer than 2 pairs)
  /// alternate_whole_runs only: this rank's peak RSS (bytes, resident_memory().peak_bytes right after each run) over
  /// the base side's runs and over the run side's, each its own when `before_run` restarts the mark; 0 in alternate.
  int64_t base_peak_bytes = 0, run_peak_bytes = 0;
};

/// Trains `run` with the even 0-based iterations on `base`'s switchable settings (TrainConfig::baseline) and leaves
/// the first `skip_pairs` pairs out of the figures (auto's timing, first-touch of the buffers). `base` must differ
/// from `run` in switchable settings only (the caller parses it with that check). Collective over MPI_COMM_WORLD;
/// throws what train() throws.
Alternation alternate(TrainConfig run, const TrainConfig& base, int64_t skip_pairs, const CommOptions& copts);

/// For settings that cannot change between iterations (the communicators' engine, the non-blocking collectives'
/// implementation): `rounds` pairs of whole runs in this process, each of `base.train_iters` iterations with its own
/// CommOptions, in the order base, run | run, base | base, run ... so that a drift over the runs favours neither
/// side. The first `skip_pairs` × 2 iterations of every run are left out; a "pair" is the same iteration index in
/// the two runs of one round (a run apart, not seconds apart: noisier than alternate()'s). `result` holds the run
/// side's last log. `before_run`, when set, is called before each run (coc tune restarts the peak-RSS mark there, so
/// that each side's peak is its own). `warm_up`: one unmeasured run of `base` first, for a process that has not
/// trained yet, whose first run also pays the first touch of its heap (15-20% slower in coc tune --candidate's MoE
/// runs on the shaped cluster, docs/performance.md point 40). Collective over MPI_COMM_WORLD.
Alternation alternate_whole_runs(const TrainConfig& run, const CommOptions& run_comm, const TrainConfig& base,
                                 const CommOptions& base_comm, int64_t skip_pairs, int rounds,
                                 const std::function<void()>& before_run = {}, bool warm_up = false);

/// The q-quantile (0..1) of `v` by linear interpolation between order statistics (numpy's default); 0 when empty.
double quantile(std::vector<double> v, double q);

}  // namespace coc::cli
