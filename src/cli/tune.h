// `coc tune` (issue 36, docs/tune.md): MindSpeed-LLM's overlap checklist walked automatically. Measure the run first
// (ms per iteration, peak memory, one profile whose most exposed communicator orders the switches), then try one
// switch at a time against the current best in one alternating run each (alternating.h), keep it only when the pairs
// show it faster beyond their spread, confirm the result against the starting point, verify it by its own profile
// (health verdicts, exposure per communicator, host-bound evidence), and write a YAML that `coc train --config`
// loads, a report, --json and an HTML page with the decision path (--report).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cli/train_options.h"

namespace coc::cli {

/// The help section of tune's own flags (the coc train flags come first); the tuned YAML leaves them out.
inline constexpr const char* kTuneGroup = "Tune (docs/tune.md)";

struct TuneOptions {
  TrainOptions train;           ///< every coc train flag (and --config)
  double budget_minutes = 30;   ///< --budget: wall time for everything; 0 = the baseline, nothing measured
  double memory_limit_mib = 0;  ///< --memory-limit: per-rank peak RSS a configuration may reach; 0 = none
  std::string out = "tuned.yaml";
  std::string json;
  bool allow_math_change = false;
  int64_t tune_iters = 20;      ///< --tune-iters: iterations of each measuring run (both sides together)
  int64_t skip_pairs = 2;       ///< --skip-pairs: leading pairs left out (auto's timing, first touch)
  std::string profile_dir;      ///< --profile-dir: keep the baseline's trace there (empty: a temporary folder)
  bool no_profile = false;      ///< --no-profile: order the switches without profiling the baseline
  std::string report_html;      ///< --report: the self-contained HTML report with the decision path
  /// --candidate "KEY=VALUE,...": measure only this candidate against the run (bench/tune_sweep.sh's one point):
  /// no baseline run, no profile, no walk, no confirmation; the step is the report.
  std::string candidate;
  /// --families a,b: walk only these families (names of family_order()); the others are skipped with that reason.
  /// coc's own, so that a tune and bench/tune_sweep.sh --families search the same switches.
  std::vector<std::string> families;
  /// Tests only (--test-keep FAMILY, hidden): the first candidate of FAMILY that runs is kept whatever its pairs say,
  /// so that a test can follow what a kept step changes (the walk after a kept layout) without timing.
  std::string test_keep;
};

/// One switch to try: coc train flag names (without dashes) and values, applied over the current best exactly as
/// `coc train --config` applies a YAML key, so that a kept candidate is written out as it was tried.
struct Candidate {
  std::string family;  ///< the switch group ("use-mc2", "fsdp-prefetch", ...), one entry of family_order()
  std::string comm;    ///< the communicator whose exposure it addresses: tp, cp, ep, fsdp, dp; "" none
  std::vector<std::pair<std::string, std::string>> keys;
  bool math_change = false;  ///< not bitwise equal under --deterministic: needs --allow-math-change
  /// A key the trainer cannot switch between iterations (is_switchable): compared by alternating whole runs.
  bool whole_run = false;
  std::string label() const;  ///< "--use-mc2 --coc-fused-kernel=false", for the report
};

/// What happened to one switch.
struct TuneStep {
  Candidate cand;
  std::string status;  ///< "kept", "rejected", "skipped", "not tried"
  std::string reason;
  double ms_before = 0, ms_after = 0;  ///< medians of the best's and the candidate's sides
  double ratio = 0, iqr = 0;           ///< median of the pairs' best/candidate ratios and their interquartile range
  double threshold = 0;                ///< the ratio it had to beat
  double peak_mib = 0;                 ///< the run's peak RSS, max over ranks (both sides: the process's mark)
  double seconds = 0;                  ///< wall time of its run
};

/// What decides which switches apply, besides the current best's TrainConfig (tune_switches.cpp).
struct SwitchContext {
  int world = 1;
  // The layout-dependent fields follow the current best (Tuner::refresh_context), not the start: a kept layout
  // changes what the later families judge.
  int replicas = 1;  ///< dp × cp: the ranks the gradients are reduced (or FSDP shards) over
  /// --pipeline-model-parallel-size (--overlap-p2p-communication applies when it is > 1).
  int pipeline = 1;
  bool tp_inside_node = true;  ///< every tp group's ranks share a node (the fused kernel's shared window)
  bool allow_math_change = false;
  /// The starting point's --comm-engine and --comm-nonblocking-impl: each family tries the other value once.
  std::string engine = "inline", nonblocking_impl = "p2p";
  /// The starting configuration: a multi-valued family never offers its value again (a kept switch is not undone
  /// by trying the start's value against it).
  const TrainConfig* start = nullptr;
  double memory_limit_mib = 0;  ///< --memory-limit (0: none)
  /// The current best's peak RSS (MiB per rank, max over ranks); < 0 when not measured (--budget 0).
  double best_peak_mib = -1;
};
/// The next candidate of one family given the current best: a candidate, or the reason the family does not apply
/// (never tried), or done (everything it offers was tried).
struct NextCandidate {
  Candidate cand;
  std::string skip_reason;
  bool done = false;
};
/// (family, communicator) in MindSpeed-LLM's checklist order, then coc's own switches, then those that need whole
/// runs or change the math; tune moves the families of the most exposed communicator to the front.
std::vector<std::pair<std::string, std::string>> family_order();
/// The next candidate of `family` given the current best (resolved) and the family's candidates tried so far.
NextCandidate next_candidate(const std::string& family, const TrainConfig& best, const SwitchContext& ctx,
                             const std::vector<Candidate>& tried);

/// The keep rule (docs/tune.md): keep when the median of the pairs' ratios best/candidate exceeds
/// 1 + max(0.02, IQR / 2), i.e. at least 2% faster and faster by more than half the pairs' interquartile spread.
double keep_threshold(double iqr);

/// Registers `coc tune` (every coc train flag plus tune's own) on `app`; returns the subcommand.
CLI::App* add_tune(CLI::App& app, TuneOptions& o);
/// Runs the tune (collective over MPI_COMM_WORLD; rank 0 prints and writes). Throws a uniform kInvalidArgument error
/// for bad tune flags (a negative budget or memory limit, too few --tune-iters for --skip-pairs, an unknown
/// --families name) and for what coc train refuses in the baseline; kIo when --out or --json cannot be written.
/// Returns the exit code.
int run_tune(CLI::App* cmd, const TuneOptions& o);

}  // namespace coc::cli
