// `coc train`: trains the LLaMA-style decoder (bytes or SentencePiece tokens) (see include/coc/model/trainer.h). The built-in default
// (no flags, 2 ranks) is the main job: tp 2, sequence parallel, N = 4, on Debian's fortunes.
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "cli/train_metrics.h"
#include "cli/train_options.h"
#include "cli/train_profile.h"
#include "coc/comm/communicator.h"
#include "coc/core/log.h"
#include "coc/core/printable.h"
#include "coc/core/progress_bar.h"
#include "coc/kernels/gemm.h"

namespace coc::cli {

namespace {
/// The configuration agreement (check_same_config) as the run's first collective: the profiler and the metrics
/// create communicators only under their flags, so ranks given different flags would otherwise meet in different
/// collectives and wait there for ever (one rank in MPI_Comm_dup, another in MPI_Comm_split).
void agree_first(const TrainOptions& opts, const ProfileOptions& prof, const MetricsOptions& metrics,
                 const TrainConfig& cfg) {
  CommOptions copts = opts.comm_options();
  const bool fingerprints = copts.check_fingerprints;
  copts.check_fingerprints = false;  // on one rank only, its extra gathers would meet nothing on the others
  const bool metrics_on = !metrics.log_json.empty() || !metrics.tensorboard_dir.empty();
  const auto world = Communicator::world("agreement", std::make_shared<ProgressEngine>(copts.engine, copts.poll_us),
                                         copts);
  // The metrics gather every rank's figures at each logged iteration: --log-interval matters with them.
  check_same_config(*world, cfg,
                    {{"--debug-collectives", fmt::format("{}", fingerprints)},
                     {"--profile", fmt::format("{}", prof.on)},
                     {"--profile-step-start", fmt::format("{}", prof.step_start)},
                     {"--profile-step-end", fmt::format("{}", prof.step_end)},
                     {"--profile-ranks", fmt::format("{}", fmt::join(prof.ranks, ","))},
                     {"--log-json", metrics.log_json.empty() ? "off" : "on"},
                     {"--tensorboard-dir", metrics.tensorboard_dir.empty() ? "off" : "on"},
                     {"--log-interval, with --log-json or --tensorboard-dir",
                      metrics_on ? fmt::format("{}", cfg.log_interval) : std::string("unused")}});
}
}  // namespace

Runner add_train_command(CLI::App& app) {
  auto opts = std::make_shared<TrainOptions>();
  opts->cfg.sequence_parallel = true;
  opts->cfg.train_iters = 300;
  opts->cfg.optim.lr = 3e-3f;
  opts->cfg.optim.min_lr = 3e-4f;
  opts->cfg.optim.weight_decay = 0.1f;
  CLI::App* cmd = app.add_subcommand("train", "Train a tensor/sequence-parallel LLaMA-style model (bytes or SentencePiece "
                                              "tokens; Megatron's and MindSpeed-LLM's flags) with CoC overlap (built-in "
                                              "default: fortunes text in bytes, tp auto (2 on 2 ranks), SP, N = 4)");
  add_train_flags(cmd, *opts);
  auto prof = std::make_shared<ProfileOptions>();
  add_profile_flags(cmd, *prof);
  auto metrics = std::make_shared<MetricsOptions>();
  add_metrics_flags(cmd, *metrics);
  return [opts, prof, metrics, cmd] {
    if (!opts->config_path.empty()) apply_yaml_config(cmd, opts->config_path);
    log::set_level(1 + opts->verbose);
    set_blas_threads(1);
    TrainConfig cfg = opts->resolve(is_terminal(STDOUT_FILENO));  // COC_STDOUT_IS_TTY and Open MPI's ptys there
    if (log::rank() == 0)
      for (const std::string& note : mindspeed_notes(opts->mindspeed)) log::info("note: {}", note);
    if (log::rank() == 0)
      for (const std::string& note : megatron_notes(opts->megatron, opts->cfg, cfg)) log::info("note: {}", note);
    agree_first(*opts, *prof, *metrics, cfg);
    TrainProfiler profiler(*prof, opts->comm_options(), cfg);
    TrainMetrics metrics_files(*metrics, opts->comm_options(), cfg);
    TrainResult r = train(cfg, opts->comm_options());
    profiler.finish();
    if (log::rank() == 0) {
      if (!r.log.empty())
        std::printf("trained %zu iterations: loss %.4f -> %.4f\n", r.log.size(), r.log.front().loss, r.log.back().loss);
      // A byte-level model may emit any byte (an untrained one mostly does): escape the control bytes and stray
      // bytes, keep whole UTF-8 characters (a Chinese or accented corpus stays readable).
      if (!r.sample.empty())
        std::printf("--- sample ---\n%s\n--------------\n", printable(r.sample, /*keep_newlines=*/true).c_str());
      std::fflush(stdout);
    }
    return 0;
  };
}

}  // namespace coc::cli
