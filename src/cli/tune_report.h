// What `coc tune` found (tune.h) and how it is written: the YAML for `coc train --config`, the terminal report,
// --json and the HTML page (--report, tune_html.cpp). Rank 0 writes them.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

#include "cli/tune.h"

namespace coc::cli {

struct TuneResult {
  std::vector<std::pair<std::string, std::string>> order;  ///< (family, communicator) in the order walked
  std::vector<TuneStep> steps;
  std::vector<std::pair<std::string, std::string>> chosen;  ///< the kept keys (empty: the baseline)
  double baseline_ms = 0, baseline_peak_mib = 0;
  bool peak_reset = true;  ///< the kernel let tune restart the peak RSS before each run
  nlohmann::json profile;  ///< exposed ms per communicator family and the worst rank's verdicts
  std::string profile_line;
  /// Step 3, verify: {"of": "tuned" | "baseline", "profile": the chosen configuration's figures as `profile`} or
  /// {"of": ..., "not_profiled": why}; null for --candidate.
  nlohmann::json verify;
  bool confirmed = false, returned_baseline = false;
  bool confirm_reused = false;  ///< the confirmation is the one kept switch's own run against the baseline
  double confirm_ms_baseline = 0, confirm_ms_tuned = 0, confirm_ratio = 0, confirm_iqr = 0;
  double seconds = 0;  ///< wall time of the whole tune
  /// The run's layout as resolved: {"world", "tp", "cp", "pp", "dp", "micro_batch_size", "global_batch_size"}
  /// (bench/tune_sweep.sh sweeps the layouts of this world at this global batch).
  nlohmann::json layout;
};

/// The YAML of the tuned configuration: every flag given to `coc tune` (on the command line or through --config)
/// except tune's own, with the kept keys over them; keys are `coc train` flag names without the dashes.
std::string tuned_yaml(CLI::App* cmd, const TuneResult& r);

/// A family's name in the report when it has no candidate: its flag, both prefetch flags, or "layout (tp, cp, pp,
/// dp)".
std::string family_label(const std::string& family);

/// The verify section's lines (no newlines): the health verdicts against exposed communication <= 10% and free < 3%,
/// what is still exposed on which communicator, and the host-bound evidence; one line when it was not profiled.
std::vector<std::string> verify_lines(const nlohmann::json& verify);

/// The self-contained HTML report (--report): the figures, every step, the verify section and the decision path as
/// inline SVG (tune_html.cpp). No scripts, no external files.
std::string tune_html(const TuneOptions& o, const TuneResult& r);

/// Writes --out, --json and --report and prints the report (rank 0 only). Throws kIo naming a file it cannot write.
void write_outputs(CLI::App* cmd, const TuneOptions& o, const TuneResult& r, const nlohmann::json& env);

}  // namespace coc::cli
