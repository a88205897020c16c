// `coc train --profile ...`: the profiler flags (MindSpeed-LLM's names: --profile, --profile-step-start,
// --profile-step-end, --profile-ranks, --profile-level; --profile-dir for its --profile-save-path) and the run
// around train(): validation and the directory check at start-up, clock alignment, and at the end the merged
// Chrome trace with its Overlap Analysis lanes plus one summary line per rank. docs/profiling.md.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coc/comm/clock_sync.h"
#include "coc/comm/communicator.h"
#include "coc/comm/mesh.h"
#include "coc/model/trainer.h"

namespace coc::cli {

struct ProfileOptions {
  bool on = false;                 ///< --profile
  int64_t step_start = 0;          ///< --profile-step-start: first profiled iteration (0-based)
  int64_t step_end = -1;           ///< --profile-step-end: first iteration not profiled; -1 = to the end
  std::vector<int> ranks{-1};      ///< --profile-ranks: world ranks; -1 = all
  std::string level = "level0";    ///< --profile-level
  std::string dir = "./profile";   ///< --profile-dir
  /// The --profile-* options given (on the command line or in --config) while --profile is not: they would be
  /// ignored, so TrainProfiler refuses them. Filled after parsing by add_profile_flags' options.
  std::vector<const CLI::Option*> window_options;
};

/// Registers the --profile* flags on `cmd` (so that --config files may set them too).
void add_profile_flags(CLI::App* cmd, ProfileOptions& o);

/// Owns the profiling of one `coc train` run. Collective over MPI_COMM_WORLD (construct and finish on every rank).
class TrainProfiler {
 public:
  /// Checks that every rank got the same --profile flags, validates them (uniform kInvalidArgument naming the flag
  /// and the fix: end <= start, a rank outside [0, world), an unknown level, a --profile-dir rank 0 cannot create
  /// or write), measures the clock offsets, and sets cfg.profile_* for this rank. Does nothing but the agreement
  /// check when --profile is off.
  TrainProfiler(const ProfileOptions& o, const CommOptions& copts, TrainConfig& cfg);
  ~TrainProfiler();
  /// Gathers every rank's records to rank 0, writes the merged trace, logs its path (rank 0), each rank's overlap
  /// summary and (rank 0, from the file) the cross-rank figures: the waits for a later rank and the compute
  /// balance. No-op when --profile is off.
  void finish();

 private:
  ProfileOptions o_;
  std::shared_ptr<ProgressEngine> engine_;
  std::unique_ptr<Communicator> world_;
  ClockOffsets clocks_;
  std::vector<int> ranks_;  ///< profiled world ranks, resolved
  MeshSizes sizes_;         ///< the run's parallel sizes, for the trace's P and M (finish)
  int64_t global_batch_ = 0, micro_batch_ = 1;
  int virtual_stages_ = 1;
};

}  // namespace coc::cli
