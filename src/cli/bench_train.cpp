// `coc bench train` (bench_train.h): coc train with the iterations alternating between a baseline (N = 1, or the
// settings of --baseline) and the run's own settings, and the per-side medians.
#include "cli/bench_train.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string_view>
#include <vector>

#include "cli/alternating.h"
#include "cli/bench_common.h"
#include "coc/comm/progress_engine.h"
#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/core/progress_bar.h"
#include "coc/kernels/gemm.h"

namespace coc::cli::bench {

using nlohmann::json;

namespace {
std::string schedule_label(const TrainConfig& c) {
  if (c.coc_fused_kernel) return "--coc-fused-kernel";
  if (c.use_mc2) return "--use-mc2";
  if (c.coc_parallel_num == CocOptions::kAuto) return "--coc-parallel-num auto";
  return fmt::format("--coc-parallel-num {} ({})", c.coc_parallel_num, to_string(c.coc_comm_algo));
}

/// The baseline side: the run's options with the --baseline flags parsed over them (the same parser as coc train,
/// so a flag means the same on both sides). Throws a uniform kInvalidArgument error for a flag the trainer cannot
/// switch between iterations, naming it, the reason and the flags that may differ.
TrainConfig parse_baseline(const TrainOptions& run, const std::string& flags, bool tty) {
  TrainOptions b = run;
  b.mindspeed.kernel_flags.clear();  // they point into the run's parser
  CLI::App app("--baseline", "coc bench train --baseline");
  add_train_flags(&app, b);  // with MindSpeed's spellings
  try {
    app.parse(flags, false);
  } catch (const CLI::ParseError& e) {
    throw_invalid("coc bench train --baseline \"{}\": {}; give the flags of coc train that the baseline changes, "
                  "e.g. --baseline \"--coc-parallel-num 1\"",
                  flags, e.what());
  }
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->count() == 0) continue;
    const std::string name = opt->get_name(false, true).substr(0, opt->get_name(false, true).find(','));
    if (!is_switchable(name))
      throw_invalid("coc bench train --baseline: {} cannot change between iterations ({}); give it outside "
                    "--baseline so that both sides use it. Flags the baseline may change: {}",
                    name, why_not_switchable(name), switchable_flags());
  }
  try {
    return b.resolve(tty);
  } catch (const Error& e) {
    throw Error(e.kind(), fmt::format("coc bench train --baseline \"{}\": on the baseline's side (the run's flags with "
                                      "these over them): {}", flags, e.what()),
                e.uniform());
  }
}
}  // namespace

CLI::App* add_train_bench(CLI::App* bench, TrainBenchOptions& o) {
  CLI::App* t = bench->add_subcommand(
      "train", "coc train with the iterations alternating between a baseline (default N = 1; --baseline FLAGS) and "
               "this run's settings (default --coc-parallel-num auto): ms per iteration of each side and the speed-up, "
               "timed in one run");
  o.train.cfg.sequence_parallel = true;
  o.train.cfg.coc_parallel_num = CocOptions::kAuto;
  o.train.cfg.train_iters = 12;
  o.train.cfg.sample_length = 0;
  o.train.cfg.optim.lr = 1e-3f;
  o.train.cfg.optim.min_lr = 1e-4f;
  add_train_flags(t, o.train);
  t->get_option("--coc-parallel-num")->default_str("auto");
  t->get_option("--train-iters")->default_str("12");
  t->add_option("--skip-pairs", o.skip_pairs,
                "Leading (N = 1, overlap) iteration pairs left out of the medians: the automatic choice times its "
                "candidates in the first overlap iteration")
      ->capture_default_str();
  t->add_option("--baseline", o.baseline,
                "The other side's flags, parsed over this run's (e.g. \"--num-to-forward-prefetch 0\" or "
                "\"--coc-parallel-num 8\", or \"--overlap-p2p-communication\" for a pipelined run, whose stages all "
                "switch at the same iteration); only settings that can change between iterations are accepted. "
                "Default: the plain Megatron order (--coc-parallel-num 1, no fused kernel, no MC2, "
                "--disable-tp-comm-bulk-wgrad --no-delay-wgrad-compute --no-delay-column-wgrad "
                "--no-attention-dense-pipeline --no-attention-dense-backward-pipeline --no-swiglu-down-pipeline "
                "--no-attention-qkv-backward-pipeline --no-swiglu-down-backward-pipeline)");
  t->add_option("--link-rate", o.link_rate, "Link bandwidth in Gbit/s, recorded in the JSON environment");
  t->add_option("--json", o.json, "Write every iteration, the medians and the environment to this JSON file");
  return t;
}

int run_train_bench(CLI::App* cmd, const TrainBenchOptions& o) {
  if (!o.train.config_path.empty()) apply_yaml_config(cmd, o.train.config_path);
  log::set_level(1 + o.train.verbose);
  set_blas_threads(1);
  TrainConfig cfg = o.train.resolve(is_terminal(STDOUT_FILENO));
  cfg.progress_bar = false;  // the per-iteration lines say which side ran
  TrainConfig base;
  if (o.baseline.empty()) {
    if (cfg.coc_parallel_num == 1 && !cfg.coc_fused_kernel && !cfg.use_mc2 && cfg.customized_coc.empty())
      throw_invalid("coc bench train: --coc-parallel-num 1 is the serial side already, so there is nothing to "
                    "compare; pass the schedule to time against it (--coc-parallel-num auto, 4, ..., or "
                    "--coc-fused-kernel), or another baseline with --baseline \"FLAGS\"");
    base = cfg;
    base.coc_parallel_num = 1;
    base.customized_coc.clear();
    base.coc_fused_kernel = base.use_mc2 = false;
    // The plain order overlaps nothing.
    base.tp_comm_bulk_wgrad = base.delay_wgrad_compute = base.delay_column_wgrad = false;
    base.attention_dense_pipeline = base.attention_dense_backward_pipeline = base.swiglu_down_pipeline = false;
    base.attention_qkv_backward_pipeline = base.swiglu_down_backward_pipeline = false;
    cfg.baseline_label = "N=1";
    cfg.run_label = "overlap";
  } else {
    base = parse_baseline(o.train, o.baseline, is_terminal(STDOUT_FILENO));
  }
  if (same_training_settings(cfg, base) && log::rank() <= 0)
    log::warn("coc bench train: the baseline (--baseline \"{}\") changes none of this run's settings, so both sides run "
              "the same way and the ratio measures only the machine's noise",
              o.baseline);
  if (!(o.link_rate >= 0)) throw_invalid("--link-rate must be >= 0 Gbit/s, got {}", o.link_rate);
  if (o.skip_pairs < 0) throw_invalid("--skip-pairs must be >= 0 (got {})", o.skip_pairs);
  if (cfg.train_iters < 2 * (o.skip_pairs + 1))
    throw_invalid("coc bench train: --train-iters {} leaves no timed pair after --skip-pairs {} (each pair is one "
                  "baseline and one run iteration); use --train-iters {} (three timed pairs) or more",
                  cfg.train_iters, o.skip_pairs, 2 * (o.skip_pairs + 3));
  if (!cfg.save.empty() || !cfg.load.empty())
    throw_invalid("coc bench train times training and writes no checkpoint: drop --save/--load");
  const CommOptions copts = o.train.comm_options();
  auto engine = std::make_shared<ProgressEngine>(copts.engine, o.train.poll_us);
  const std::unique_ptr<Communicator> world_comm = Communicator::world("bench world", engine, copts);
  Communicator& world = *world_comm;
  if (!o.json.empty()) check_writable(world, o.json, "--json");
  const json env = environment(world, o.link_rate);

  const Alternation alt = alternate(cfg, base, o.skip_pairs, copts);
  const TrainResult& r = alt.result;

  json rows = json::array();
  for (size_t i = 0; i < r.log.size(); ++i) {
    const IterationLog& l = r.log[i];
    const bool timed = static_cast<int64_t>(i) >= 2 * o.skip_pairs;
    rows.push_back({{"iteration", l.iteration}, {"schedule", l.baseline ? cfg.baseline_label : cfg.run_label},
                    {"ms", l.elapsed_ms}, {"loss", l.loss}, {"coc_gemm_ms", l.gemm_ms},
                    {"coc_comm_wait_ms", l.comm_wait_ms}, {"timed", timed}});
  }
  const double ms_base = alt.base_median, ms_own = alt.run_median;
  const double speedup = ms_own > 0 ? ms_base / ms_own : 0;
  const std::string base_desc = o.baseline.empty() ? "N=1" : fmt::format("the baseline ({})", o.baseline);
  const std::string own_desc = o.baseline.empty() ? schedule_label(cfg) : std::string("this run's flags");
  if (world.rank() == 0) {
    std::printf("coc bench train: %zu iterations alternating %s and %s (first %lld pair(s) left out):\n",
                r.log.size(), base_desc.c_str(), own_desc.c_str(), static_cast<long long>(o.skip_pairs));
    const std::string base_name = o.baseline.empty() ? "N=1 (serial):" : "baseline:";
    const std::string own_name = o.baseline.empty() ? "overlap:" : "run:";
    std::printf("  %-14s %8.1f ms per iteration (median of %zu)\n", base_name.c_str(), ms_base, alt.base_ms.size());
    std::printf("  %-14s %8.1f ms per iteration (median of %zu)  -> %.3fx, %.1f%% %s; median of the "
                "pairs' ratios %.3fx\n",
                own_name.c_str(), ms_own, alt.run_ms.size(), speedup, std::abs(speedup - 1) * 100,
                speedup >= 1 ? "faster" : "slower", alt.ratio_median);
    if (!r.log.empty())
      std::printf("  loss %.4f -> %.4f%s\n", r.log.front().loss, r.log.back().loss,
                  cfg.deterministic ? " (--deterministic: the curve of either side alone)" : "");
    std::fflush(stdout);
    if (!o.json.empty())
      write_json(o.json, {{"command", "bench train"},
                          {"schedule", schedule_label(cfg)},
                          {"baseline", o.baseline.empty() ? "--coc-parallel-num 1" : o.baseline},
                          {"deterministic", cfg.deterministic},
                          {"skip_pairs", o.skip_pairs},
                          {"ms_per_iter_baseline", ms_base},
                          {"ms_per_iter_run", ms_own},
                          {"speedup", speedup},
                          {"speedup_median_of_pairs", alt.ratio_median},
                          {"pair_ratio_iqr", alt.ratio_iqr},
                          {"iterations", rows},
                          {"environment", env}});
  }
  return 0;
}

}  // namespace coc::cli::bench
