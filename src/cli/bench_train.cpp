// `coc bench train` (bench_train.h): coc train with the iterations alternating between N = 1 and the configured
// schedule, and the per-side medians.
#include "cli/bench_train.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "cli/bench_common.h"
#include "coc/comm/progress_engine.h"
#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/core/median.h"
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
}  // namespace

CLI::App* add_train_bench(CLI::App* bench, TrainBenchOptions& o) {
  CLI::App* t = bench->add_subcommand(
      "train", "coc train with the iterations alternating between N = 1 and the given schedule (default: "
               "--coc-parallel-num auto): ms per iteration of each side and the speed-up, timed in one run");
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
  t->add_option("--link-rate", o.link_rate, "Link bandwidth in Gbit/s, recorded in the JSON environment");
  t->add_option("--json", o.json, "Write every iteration, the medians and the environment to this JSON file");
  return t;
}

int run_train_bench(CLI::App* cmd, const TrainBenchOptions& o) {
  if (!o.train.config_path.empty()) apply_yaml_config(cmd, o.train.config_path);
  log::set_level(1 + o.train.verbose);
  set_blas_threads(1);
  TrainConfig cfg = o.train.resolve(is_terminal(STDOUT_FILENO));
  cfg.ab_serial = true;
  cfg.progress_bar = false;  // the per-iteration lines say which side ran
  if (cfg.coc_parallel_num == 1 && !cfg.coc_fused_kernel && !cfg.use_mc2 && cfg.customized_coc.empty())
    throw_invalid("coc bench train: --coc-parallel-num 1 is the serial side already, so there is nothing to compare; "
                  "pass the schedule to time against it (--coc-parallel-num auto, 4, ..., or --coc-fused-kernel)");
  if (!(o.link_rate >= 0)) throw_invalid("--link-rate must be >= 0 Gbit/s, got {}", o.link_rate);
  if (o.skip_pairs < 0) throw_invalid("--skip-pairs must be >= 0 (got {})", o.skip_pairs);
  if (cfg.train_iters < 2 * (o.skip_pairs + 1))
    throw_invalid("coc bench train: --train-iters {} leaves no timed pair after --skip-pairs {} (each pair is one "
                  "N = 1 and one overlapped iteration); use --train-iters {} (three timed pairs) or more",
                  cfg.train_iters, o.skip_pairs, 2 * (o.skip_pairs + 3));
  if (!cfg.save.empty() || !cfg.load.empty())
    throw_invalid("coc bench train times training and writes no checkpoint: drop --save/--load");
  const CommOptions copts = o.train.comm_options();
  auto engine = std::make_shared<ProgressEngine>(copts.engine, o.train.poll_us);
  const std::unique_ptr<Communicator> world_comm = Communicator::world("bench world", engine, copts);
  Communicator& world = *world_comm;
  if (!o.json.empty()) check_writable(world, o.json, "--json");
  const json env = environment(world, o.link_rate);

  TrainResult r = train(cfg, copts);

  std::vector<double> serial, overlap, ratio;
  json rows = json::array();
  for (size_t i = 0; i < r.log.size(); ++i) {
    const IterationLog& l = r.log[i];
    const bool timed = static_cast<int64_t>(i) >= 2 * o.skip_pairs;
    rows.push_back({{"iteration", l.iteration}, {"schedule", l.serial ? "N=1" : "overlap"}, {"ms", l.elapsed_ms},
                    {"loss", l.loss}, {"coc_gemm_ms", l.gemm_ms}, {"coc_comm_wait_ms", l.comm_wait_ms},
                    {"timed", timed}});
    if (!timed) continue;
    (l.serial ? serial : overlap).push_back(l.elapsed_ms);
    if (!l.serial && i > 0 && r.log[i - 1].serial) ratio.push_back(r.log[i - 1].elapsed_ms / l.elapsed_ms);
  }
  const double ms_serial = median(serial), ms_overlap = median(overlap);
  const double speedup = ms_overlap > 0 ? ms_serial / ms_overlap : 0;
  if (world.rank() == 0) {
    std::printf("coc bench train: %zu iterations alternating N=1 and %s (first %lld pair(s) left out):\n",
                r.log.size(), schedule_label(cfg).c_str(), static_cast<long long>(o.skip_pairs));
    std::printf("  N=1 (serial):  %8.1f ms per iteration (median of %zu)\n", ms_serial, serial.size());
    std::printf("  overlap:       %8.1f ms per iteration (median of %zu)  -> %.3fx, %.1f%% %s; median of the "
                "pairs' ratios %.3fx\n",
                ms_overlap, overlap.size(), speedup, std::abs(speedup - 1) * 100, speedup >= 1 ? "faster" : "slower",
                median(ratio));
    if (!r.log.empty())
      std::printf("  loss %.4f -> %.4f%s\n", r.log.front().loss, r.log.back().loss,
                  cfg.deterministic ? " (--deterministic: the curve of either schedule alone)" : "");
    std::fflush(stdout);
    if (!o.json.empty())
      write_json(o.json, {{"command", "bench train"},
                          {"schedule", schedule_label(cfg)},
                          {"deterministic", cfg.deterministic},
                          {"skip_pairs", o.skip_pairs},
                          {"ms_per_iter_serial", ms_serial},
                          {"ms_per_iter_overlap", ms_overlap},
                          {"speedup", speedup},
                          {"speedup_median_of_pairs", median(ratio)},
                          {"iterations", rows},
                          {"environment", env}});
  }
  return 0;
}

}  // namespace coc::cli::bench
