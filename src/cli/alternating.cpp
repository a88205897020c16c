// Two settings timed in one training run (alternating.h).
#include "cli/alternating.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "coc/core/median.h"
#include "coc/overlap/coc_ops.h"
#include "coc/runtime/memory.h"

namespace coc::cli {

namespace {
constexpr std::string_view kSwitchableFlags[] = {
    "--coc-parallel-num",       "--coc-comm-algo",           "--customized-coc",          "--coc-min-chunk-rows",
    "--coc-fused-kernel",       "--use-mc2",                 "--use-ascend-mc2",          "--coc-mode",
    "--use-ascend-coc",         "--use-cp-send-recv-overlap", "--tp-comm-bulk-wgrad",     "--disable-tp-comm-bulk-wgrad",
    "--delay-wgrad-compute",    "--no-delay-wgrad-compute",  "--num-to-forward-prefetch", "--num-to-backward-prefetch",
    "--overlap-grad-reduce",    "--no-overlap-grad-reduce",  "--ep-dispatcher",           "--moe-mc2-chunks",
    "--delay-column-wgrad",     "--no-delay-column-wgrad",   "--attention-dense-pipeline",
    "--no-attention-dense-pipeline", "--attention-dense-backward-pipeline", "--no-attention-dense-backward-pipeline",
    "--swiglu-down-pipeline", "--no-swiglu-down-pipeline", "--attention-qkv-backward-pipeline",
    "--no-attention-qkv-backward-pipeline", "--swiglu-down-backward-pipeline", "--no-swiglu-down-backward-pipeline",
    "--gemm-backend", "--recompute-granularity",
    "--recompute-method", "--recompute-num-layers", "--recompute-activations", "--bf16", "--no-bf16",
    "--overlap-p2p-communication", "--no-overlap-p2p-communication", "--overlap-forward-micro-batches",
    "--no-overlap-forward-micro-batches"};
}  // namespace

bool is_switchable(std::string_view flag) {
  return std::find(std::begin(kSwitchableFlags), std::end(kSwitchableFlags), flag) != std::end(kSwitchableFlags);
}

std::string switchable_flags() { return fmt::format("{}", fmt::join(kSwitchableFlags, ", ")); }

std::string why_not_switchable(const std::string& flag) {
  static const std::vector<std::pair<std::vector<std::string_view>, std::string_view>> reasons = {
      {{"--tensor-model-parallel-size", "--context-parallel-size", "--context-parallel-algo", "--cp-window-size",
        "--sequence-parallel", "--no-sequence-parallel", "--pipeline-model-parallel-size",
        "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
        "--num-virtual-stages-per-pipeline-rank", "--num-layers-per-virtual-pipeline-stage"},
       "the rank mesh and the layers' sharding are built once per run"},
      {{"--model-preset", "--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size",
        "--seq-length", "--group-query-attention", "--num-query-groups", "--attention-mask-type", "--norm-epsilon",
        "--rotary-base", "--init-method-std", "--seed"},
       "both sides train one model, built once"},
      {{"--use-deter-comp", "--deterministic"},
       "it changes the reduction order of every collective, so the sides would train different numbers"},
      {{"--comm-engine", "--comm-poll-us", "--comm-nonblocking-impl", "--distributed-timeout-minutes",
        "--debug-collectives"},
       "the communicators are built once per run"},
      {{"--vocab-parallel-comm"},
       "it changes the order of the vocabulary layers' sums, so the sides would train different numbers"},
      {{"--data-parallel-sharding-strategy"},
       "the shards, the optimizer state on them and the module hooks are built once per run"},
  };
  for (const auto& [flags, why] : reasons)
    for (std::string_view f : flags)
      if (f == flag) return std::string(why);
  return "both sides share one model, data stream, optimizer and log, set once per run";
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

Alternation alternate(TrainConfig run, const TrainConfig& base, int64_t skip_pairs, const CommOptions& copts) {
  run.baseline = std::make_shared<TrainConfig>(base);
  Alternation a;
  a.result = train(run, copts);
  const std::vector<IterationLog>& log = a.result.log;
  for (size_t i = 0; i < log.size(); ++i) {
    if (static_cast<int64_t>(i) < 2 * skip_pairs) continue;
    (log[i].baseline ? a.base_ms : a.run_ms).push_back(log[i].elapsed_ms);
    if (!log[i].baseline && i > 0 && log[i - 1].baseline && log[i].elapsed_ms > 0)
      a.ratios.push_back(log[i - 1].elapsed_ms / log[i].elapsed_ms);
  }
  a.base_median = median(a.base_ms);
  a.run_median = median(a.run_ms);
  a.ratio_median = median(a.ratios);
  a.ratio_iqr = a.ratios.size() < 2 ? 0 : quantile(a.ratios, 0.75) - quantile(a.ratios, 0.25);
  return a;
}

Alternation alternate_whole_runs(const TrainConfig& run, const CommOptions& run_comm, const TrainConfig& base,
                                 const CommOptions& base_comm, int64_t skip_pairs, int rounds,
                                 const std::function<void()>& before_run, bool warm_up) {
  Alternation a;
  const auto one_run = [&](const TrainConfig& c, const CommOptions& co, int64_t& peak) {
    if (before_run) before_run();
    TrainResult r = train(c, co);
    peak = std::max(peak, resident_memory().peak_bytes);
    return r;
  };
  if (warm_up) {
    int64_t unused = 0;
    one_run(base, base_comm, unused);
  }
  for (int k = 0; k < rounds; ++k) {
    TrainResult b;
    if (k % 2 == 0) {
      b = one_run(base, base_comm, a.base_peak_bytes);
      a.result = one_run(run, run_comm, a.run_peak_bytes);
    } else {
      a.result = one_run(run, run_comm, a.run_peak_bytes);
      b = one_run(base, base_comm, a.base_peak_bytes);
    }
    const size_t n = std::min(b.log.size(), a.result.log.size());
    for (size_t i = static_cast<size_t>(2 * skip_pairs); i < n; ++i) {
      a.base_ms.push_back(b.log[i].elapsed_ms);
      a.run_ms.push_back(a.result.log[i].elapsed_ms);
      if (a.result.log[i].elapsed_ms > 0) a.ratios.push_back(b.log[i].elapsed_ms / a.result.log[i].elapsed_ms);
    }
  }
  a.base_median = median(a.base_ms);
  a.run_median = median(a.run_ms);
  a.ratio_median = median(a.ratios);
  a.ratio_iqr = a.ratios.size() < 2 ? 0 : quantile(a.ratios, 0.75) - quantile(a.ratios, 0.25);
  return a;
}

}  // namespace coc::cli
