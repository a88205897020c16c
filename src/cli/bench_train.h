// `coc bench train`: end-to-end training time of two settings in one run. The iterations alternate between a
// baseline (the plain Megatron order N = 1, or --baseline FLAGS) and the run's own settings (TrainConfig::baseline),
// so that both are timed
// seconds apart on the same model, data and machine state (docs/performance.md, "How overlap is measured": compare
// overlap on and off in the same run). Whole runs one after the other measured the drift of a shared VM instead: the
// same binary and cluster gave 1.03x to 1.46x in four pairs of alternating runs.
#pragma once

#include <memory>

#include <CLI/CLI.hpp>

#include "cli/train_options.h"

namespace coc::cli::bench {

struct TrainBenchOptions {
  TrainOptions train;
  int64_t skip_pairs = 2;  ///< leading (N = 1, overlap) pairs left out: auto's timing, the ops' first scratch
  double link_rate = 0;  ///< Gbit/s, recorded in the environment; 0 = not given
  std::string json;
  std::string baseline;  ///< --baseline: coc train flags parsed over the run's; empty: N = 1
};

/// Registers `coc bench train` (every `coc train` flag, plus --skip-pairs and --json) on `bench`; returns the
/// subcommand.
CLI::App* add_train_bench(CLI::App* bench, TrainBenchOptions& o);

/// Trains with alternating schedules and prints, on rank 0, the median elapsed time per iteration of each side, the
/// speed-up (ratio of the medians, and the median of the per-pair ratios) and the losses. Collective over
/// MPI_COMM_WORLD; returns the exit code. Throws a uniform kInvalidArgument error when there is nothing to compare
/// (--coc-parallel-num 1 without a fused kernel and no --baseline), when --baseline names a flag that cannot change
/// between iterations, or too few iterations for --skip-pairs; kIo when --json cannot be written.
int run_train_bench(CLI::App* cmd, const TrainBenchOptions& o);

}  // namespace coc::cli::bench
