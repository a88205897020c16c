// The switches `coc tune` walks (tune.h): which apply to a run, with the reason when one does not, and the next
// candidate of each family given the current best. The order is MindSpeed-LLM's overlap checklist (FSDP prefetch,
// MC2 under TP + SP, the fused kernel, the EP dispatcher, the ring's send/receive overlap), with the sharding
// strategy and the ring's window beside their own, then coc's own CoC schedule and backward switches, the
// data-parallel and pipeline overlaps, the communicator options, and the switches that change the math.
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "cli/tune.h"
#include "coc/kernels/gemm.h"
#include "coc/overlap/coc_ops.h"
#include "coc/parallel/fsdp.h"
#include "coc/parallel/moe.h"

namespace coc::cli {

namespace {
using Keys = std::vector<std::pair<std::string, std::string>>;

bool was_tried(const std::vector<Candidate>& tried, const Keys& keys) {
  return std::any_of(tried.begin(), tried.end(), [&](const Candidate& c) { return c.keys == keys; });
}

/// The first of `options` not tried yet, or done.
NextCandidate first_untried(const std::string& family, const std::string& comm, const std::vector<Keys>& options,
                            const std::vector<Candidate>& tried, bool math_change = false) {
  for (const Keys& k : options)
    if (!was_tried(tried, k)) return {Candidate{family, comm, k, math_change}, "", false};
  return {{}, "", true};
}

NextCandidate skip(std::string reason) { return {{}, std::move(reason), false}; }

/// An on/off overlap switch that is on by default: tried on when the run has it off.
NextCandidate turn_on(const std::string& family, const std::string& key, bool on, const std::vector<Candidate>& tried) {
  if (on && tried.empty()) return skip("already on");
  if (on) return {{}, "", true};
  return first_untried(family, "tp", {{{key, "true"}}}, tried);
}

std::string coc_num(int n) { return n == CocOptions::kAuto ? "auto" : std::to_string(n); }

NextCandidate tp_family(const std::string& f, const TrainConfig& b, const SwitchContext& ctx,
                        const std::vector<Candidate>& tried) {
  const int tp = b.tensor_model_parallel_size;
  if (tp <= 1) return skip(fmt::format("--{}: needs tensor parallelism (tp > 1; this run has tp {})", f, tp));
  const bool ring = b.context_parallel_size > 1 || b.attention_mask != AttnMask::kCausal;
  if (f == "use-mc2") {
    if (!b.sequence_parallel) return skip("--use-mc2: needs --sequence-parallel with tp > 1");
    if (b.use_mc2) return tried.empty() ? skip("already on") : NextCandidate{{}, "", true};
    return first_untried(f, "tp", {{{"use-mc2", "true"}, {"coc-fused-kernel", "false"}}}, tried);
  }
  if (f == "coc-fused-kernel") {
    if (!ctx.tp_inside_node)
      return skip("--coc-fused-kernel: a tp group spans nodes, where it falls back to the chunked pipeline");
    if (b.use_mc2) return skip("--coc-fused-kernel: --use-mc2 is on (they exclude each other)");
    if (b.coc_fused_kernel) return tried.empty() ? skip("already on") : NextCandidate{{}, "", true};
    return first_untried(f, "tp", {{{"coc-fused-kernel", "true"}}}, tried);
  }
  if (f == "coc-parallel-num") {
    if (!b.customized_coc.empty()) return skip("--coc-parallel-num: --customized-coc sets N per GEMM shape");
    std::vector<Keys> options;
    for (int n : {CocOptions::kAuto, 4, 8})
      if (n != ctx.start->coc_parallel_num && n != b.coc_parallel_num)
        options.push_back({{"coc-parallel-num", coc_num(n)}});
    return first_untried(f, "tp", options, tried);
  }
  if (f == "coc-comm-algo") {
    if (b.coc_parallel_num == CocOptions::kAuto || b.coc_parallel_num == 1 || b.coc_fused_kernel || b.use_mc2)
      return skip("--coc-comm-algo: needs an explicit --coc-parallel-num N > 1 without a fused kernel (auto times "
                  "both itself)");
    if (!tried.empty()) return {{}, "", true};  // one try: the other algorithm than the run's
    return first_untried(f, "tp", {{{"coc-comm-algo", b.coc_comm_algo == CocCommAlgo::kP2p ? "collective" : "p2p"}}},
                         tried);
  }
  if (f == "tp-comm-bulk-wgrad") return turn_on(f, f, b.tp_comm_bulk_wgrad, tried);
  if (f == "delay-wgrad-compute") return turn_on(f, f, b.delay_wgrad_compute, tried);
  if (f == "delay-column-wgrad") {
    if (!b.sequence_parallel || !b.delay_wgrad_compute)
      return skip("--delay-column-wgrad: needs --sequence-parallel and --delay-wgrad-compute");
    return turn_on(f, f, b.delay_column_wgrad, tried);
  }
  if (f == "attention-dense-pipeline" || f == "attention-dense-backward-pipeline" ||
      f == "attention-qkv-backward-pipeline") {
    if (ring) return skip(fmt::format("--{}: not with ring attention (cp > 1 or the general mask)", f));
    if (f == "attention-dense-backward-pipeline" && !b.sequence_parallel)
      return skip("--attention-dense-backward-pipeline: needs --sequence-parallel");
    return turn_on(f, f,
                   f == "attention-dense-pipeline"            ? b.attention_dense_pipeline
                   : f == "attention-dense-backward-pipeline" ? b.attention_dense_backward_pipeline
                                                              : b.attention_qkv_backward_pipeline,
                   tried);
  }
  if (f == "swiglu-down-pipeline") return turn_on(f, f, b.swiglu_down_pipeline, tried);
  if (f == "swiglu-down-backward-pipeline") {
    if (!b.sequence_parallel) return skip("--swiglu-down-backward-pipeline: needs --sequence-parallel");
    return turn_on(f, f, b.swiglu_down_backward_pipeline, tried);
  }
  if (f == "overlap-forward-micro-batches") {
    const int64_t dp = std::max(1, ctx.replicas / std::max(1, b.context_parallel_size));
    const int64_t micro_batches = b.global_batch_size / (b.micro_batch_size * dp);
    if (micro_batches < 2)
      return skip(fmt::format("--overlap-forward-micro-batches: needs two or more micro-batches per iteration (this "
                              "run has {})", micro_batches));
    if (ring || ctx.pipeline > 1 || b.model.is_moe() || b.recompute.granularity != RecomputeGranularity::kNone ||
        b.data_parallel_sharding_strategy != ShardingStrategy::kNoShard)
      return skip("--overlap-forward-micro-batches: not with pipeline or context parallelism, MoE, recomputation or "
                  "a sharded strategy");
    return turn_on(f, f, b.overlap_forward_micro_batches, tried);
  }
  return skip("unknown family " + f);
}
/// --bf16 and --grad-reduce-in-bf16: math changes (another rounding of the GEMMs and the stored activations; of the
/// gradients' sum), so they need --allow-math-change. --fp16 is not tried: it is no faster than fp32 on CPUs
/// (docs/mixed-precision.md).
NextCandidate precision_family(const std::string& f, const TrainConfig& b, const SwitchContext& ctx,
                               const std::vector<Candidate>& tried) {
  if (b.fp16) return skip(fmt::format("--{}: the run trains in fp16 (one element type per run)", f));
  if (f == "bf16") {
    if (b.bf16) return tried.empty() ? skip("already on") : NextCandidate{{}, "", true};
    if (!ctx.allow_math_change)
      return skip("--bf16: bf16 GEMMs and stored activations round differently (not bitwise under --deterministic); "
                  "pass --allow-math-change to try it");
    return first_untried(f, "", {{{"bf16", "true"}}}, tried, /*math_change=*/true);
  }
  if (ctx.replicas <= 1)
    return skip("--grad-reduce-in-bf16: needs data or context parallelism (dp × cp > 1): it halves the gradient "
                "reduction's bytes");
  if (!b.bf16) return skip("--grad-reduce-in-bf16: needs --bf16 (on in the run, or kept by tune before it)");
  if (b.grad_reduce_in_bf16) return tried.empty() ? skip("already on") : NextCandidate{{}, "", true};
  if (!ctx.allow_math_change)
    return skip("--grad-reduce-in-bf16: each rank's gradient is rounded to bf16 before the sum (not bitwise under "
                "--deterministic); pass --allow-math-change to try it");
  return first_untried(f, "dp", {{{"grad-reduce-in-bf16", "true"}}}, tried, /*math_change=*/true);
}

/// A run's layout: tp, cp, pp and dp, with dp = world / (tp·cp·pp) as TrainOptions::resolve and mesh_dense_dp
/// compute it (ep subdivides dp × cp and is not part of it).
using Layout = std::array<int, 4>;
constexpr const char* kLayoutKeys[] = {"tensor-model-parallel-size", "context-parallel-size",
                                       "pipeline-model-parallel-size"};

Layout layout_of(const TrainConfig& c, int world) {
  const int tp = std::max(1, c.tensor_model_parallel_size), cp = std::max(1, c.context_parallel_size),
            pp = std::max(1, c.pipeline_model_parallel_size);
  return {tp, cp, pp, std::max(1, world / (tp * cp * pp))};
}

/// The distinct prime factors of n, ascending.
std::vector<int> prime_factors(int n) {
  std::vector<int> p;
  for (int f = 2; f * f <= n; ++f)
    if (n % f == 0) {
      p.push_back(f);
      while (n % f == 0) n /= f;
    }
  if (n > 1) p.push_back(n);
  return p;
}

/// The layouts one step away from `l`: one prime factor p of one dimension moved to another, in a fixed order: the
/// dimension it leaves in the order tp, cp, pp, dp; its primes ascending; the dimension it joins in the same order.
/// Every neighbour keeps the world size (tp·cp·pp·dp).
std::vector<Layout> layout_neighbours(const Layout& l) {
  std::vector<Layout> out;
  for (size_t from = 0; from < 4; ++from)
    for (int p : prime_factors(l[from]))
      for (size_t to = 0; to < 4; ++to) {
        if (to == from) continue;
        Layout n = l;
        n[from] /= p;
        n[to] *= p;
        out.push_back(n);
      }
  return out;
}

/// The layout a tried layout candidate measured (its keys always name tp, cp and pp).
Layout layout_of_keys(const Keys& keys, int world) {
  Layout l{1, 1, 1, 1};
  for (const auto& [k, v] : keys)
    for (size_t d = 0; d < 3; ++d)
      if (k == kLayoutKeys[d]) l[d] = std::stoi(v);
  l[3] = std::max(1, world / (l[0] * l[1] * l[2]));
  return l;
}

/// The keys of layout `n` over the best `b`: tp, cp and pp; the micro-batch where the global batch needs a smaller
/// one; the global batch where coc train's automatic one would
/// change with dp (TrainOptions::resolve: the smallest multiple of micro-batch × dp >= 16); and the kept switches the
/// new layout makes void or refused turned off (tp 1: sequence parallelism and the TP-only switches that need it; cp
/// 1: the ring's options; pp 1: the pipeline's), so that the YAML holds exactly what was measured. Sequence
/// parallelism comes back on when tp grows from 1 again and the start had it (not for MoE, which refuses it at tp > 1).
Keys layout_keys(const Layout& n, const TrainConfig& b, const SwitchContext& ctx) {
  Keys k;
  for (size_t d = 0; d < 3; ++d) k.emplace_back(kLayoutKeys[d], std::to_string(n[d]));
  // The global batch stays, so a larger dp may need a smaller micro-batch: the largest up to the best's that divides
  // a data-parallel rank's share (global 4, micro-batch 4, dp 1 → 2: micro-batch 2); none when dp does not divide it,
  // and coc train's refusal says why.
  int64_t mb = b.micro_batch_size;
  if (b.global_batch_size % n[3] == 0)
    while (mb > 1 && (b.global_batch_size / n[3]) % mb != 0) --mb;
  if (mb != b.micro_batch_size) k.emplace_back("micro-batch-size", std::to_string(mb));
  const int64_t step = mb * n[3];
  if ((16 + step - 1) / step * step != b.global_batch_size)
    k.emplace_back("global-batch-size", std::to_string(b.global_batch_size));
  const auto off = [&](bool on, const char* key) {
    if (on) k.emplace_back(key, "false");
  };
  if (n[0] == 1 && b.tensor_model_parallel_size > 1) {
    off(b.sequence_parallel, "sequence-parallel");
    off(b.use_mc2, "use-mc2");
    off(b.coc_fused_kernel, "coc-fused-kernel");
    off(b.delay_column_wgrad, "delay-column-wgrad");
    off(b.attention_dense_backward_pipeline, "attention-dense-backward-pipeline");
    off(b.swiglu_down_backward_pipeline, "swiglu-down-backward-pipeline");
    if (b.vocab_comm == VocabComm::kWeights) k.emplace_back("vocab-parallel-comm", "auto");
  } else if (n[0] > 1 && b.model.is_moe()) {
    off(b.sequence_parallel, "sequence-parallel");
  } else if (n[0] > 1 && b.tensor_model_parallel_size == 1 && ctx.start->sequence_parallel && !b.sequence_parallel) {
    k.emplace_back("sequence-parallel", "true");
  }
  if (n[1] == 1 && b.context_parallel_size > 1) {
    off(b.cp_send_recv_overlap, "use-cp-send-recv-overlap");
    if (b.cp_window_size != 1) k.emplace_back("cp-window-size", "1");
  }
  if (n[2] == 1 && b.pipeline_model_parallel_size > 1) {
    off(b.overlap_p2p_communication, "overlap-p2p-communication");
    if (b.pipeline_split.first_stage_layers > 0) k.emplace_back("decoder-first-pipeline-num-layers", "0");
    if (b.pipeline_split.last_stage_layers > 0) k.emplace_back("decoder-last-pipeline-num-layers", "0");
    if (b.pipeline_split.virtual_stages > 1) k.emplace_back("num-virtual-stages-per-pipeline-rank", "1");
  }
  return k;
}

/// The layout (tp, cp, pp, dp): a math change (another tp split sums the row-parallel GEMMs' partial products in
/// another order, another dp sums the gradients over other ranks), by whole runs (the mesh is built once per run).
/// The neighbours of the current best one at a time, never the start's layout nor one tried; tune checks each
/// against coc train's rules before running it (Tuner::walk) and skips a refused one with the trainer's reason.
NextCandidate layout_family(const TrainConfig& b, const SwitchContext& ctx, const std::vector<Candidate>& tried) {
  if (ctx.world <= 1) return skip("layout: one rank has one layout (tp = cp = pp = dp = 1)");
  if (!ctx.allow_math_change)
    return skip("layout: another tp split sums the row-parallel GEMMs in another order, another dp the gradients "
                "over other ranks (not bitwise under --deterministic); pass --allow-math-change to try it");
  const Layout start = layout_of(*ctx.start, ctx.world);
  for (const Layout& n : layout_neighbours(layout_of(b, ctx.world))) {
    if (n == start) continue;
    if (std::any_of(tried.begin(), tried.end(), [&](const Candidate& c) { return layout_of_keys(c.keys, ctx.world) == n; }))
      continue;
    return {Candidate{"layout", "", layout_keys(n, b, ctx), /*math_change=*/true}, "", false};
  }
  return {{}, "", true};
}

/// Recomputation (--recompute-granularity): the same bits under --deterministic (docs/design.md, "Recomputation";
/// tests/model/test_recompute.cpp, tests/cli/recompute.sh), so no math change. It trades compute for activation
/// memory, so it is offered only while the best exceeds --memory-limit (or its peak is not measured, --budget 0):
/// selective first (the attention probabilities only; nothing under ring attention, which keeps none), then full
/// (every layer recomputed from its input, one layer a chunk).
NextCandidate recompute_family(const TrainConfig& b, const SwitchContext& ctx, const std::vector<Candidate>& tried) {
  if (b.recompute.granularity != RecomputeGranularity::kNone)
    return tried.empty() ? skip(fmt::format("already on (--recompute-granularity {})", to_string(b.recompute.granularity)))
                         : NextCandidate{{}, "", true};
  if (ctx.memory_limit_mib <= 0)
    return skip("--recompute-granularity: no --memory-limit; recomputation only adds compute (it trades compute for "
                "activation memory)");
  if (ctx.best_peak_mib >= 0 && ctx.best_peak_mib <= ctx.memory_limit_mib)
    return skip(fmt::format("--recompute-granularity: the run fits in --memory-limit (peak {:.0f} of {:.0f} MiB per "
                            "rank); recomputation only adds compute",
                            ctx.best_peak_mib, ctx.memory_limit_mib));
  std::vector<Keys> options;
  if (b.context_parallel_size <= 1 && b.attention_mask == AttnMask::kCausal)
    options.push_back({{"recompute-granularity", "selective"}});
  options.push_back({{"recompute-granularity", "full"}, {"recompute-method", "uniform"}, {"recompute-num-layers", "1"}});
  return first_untried("recompute-granularity", "", options, tried);
}
}  // namespace

std::vector<std::pair<std::string, std::string>> family_order() {
  return {{"fsdp-prefetch", "fsdp"},
          {"data-parallel-sharding-strategy", "dp"},  // after the prefetch, which its start may have (ZeRO-3)
          {"use-mc2", "tp"},
          {"coc-fused-kernel", "tp"},
          {"ep-dispatcher", "ep"},
          {"moe-mc2-chunks", "ep"},
          {"use-cp-send-recv-overlap", "cp"},
          {"cp-window-size", "cp"},
          {"coc-parallel-num", "tp"},
          {"coc-comm-algo", "tp"},
          {"tp-comm-bulk-wgrad", "tp"},
          {"delay-wgrad-compute", "tp"},
          {"delay-column-wgrad", "tp"},
          {"attention-dense-pipeline", "tp"},
          {"attention-dense-backward-pipeline", "tp"},
          {"swiglu-down-pipeline", "tp"},
          {"attention-qkv-backward-pipeline", "tp"},
          {"swiglu-down-backward-pipeline", "tp"},
          {"overlap-grad-reduce", "dp"},
          {"overlap-p2p-communication", "pp"},
          {"comm-engine", ""},
          {"comm-nonblocking-impl", ""},
          {"gemm-backend", ""},
          {"bf16", ""},
          {"grad-reduce-in-bf16", ""},  // after --bf16, which it needs, whatever the profile says
          {"layout", ""},               // before the micro-batch size, whose arithmetic depends on dp
          {"micro-batch-size", ""},
          // After the micro-batch size, which may leave two micro-batches per iteration where there was one.
          {"overlap-forward-micro-batches", "tp"},
          // Last: it only adds compute. Tune moves it to the front when the baseline exceeds --memory-limit.
          {"recompute-granularity", ""}};
}

NextCandidate next_candidate(const std::string& f, const TrainConfig& b, const SwitchContext& ctx,
                             const std::vector<Candidate>& tried) {
  if (f == "fsdp-prefetch") {
    if (b.data_parallel_sharding_strategy != ShardingStrategy::kOptimGradsParams || ctx.replicas <= 1)
      return skip("--num-to-forward-prefetch/--num-to-backward-prefetch: need --data-parallel-sharding-strategy "
                  "optim_grads_params over dp × cp > 1 ranks");
    const int depth = std::max(b.num_to_forward_prefetch, b.num_to_backward_prefetch) + 1;
    if (depth > 2) return tried.empty() ? skip("already at depth 2 (the deepest tune tries)") : NextCandidate{{}, "", true};
    const std::string d = std::to_string(depth);
    return first_untried(f, "fsdp", {{{"num-to-forward-prefetch", d}, {"num-to-backward-prefetch", d}}}, tried);
  }
  if (f == "ep-dispatcher" || f == "moe-mc2-chunks") {
    if (!b.model.is_moe() || b.expert_model_parallel_size <= 1)
      return skip(fmt::format("--{}: needs a MoE model with expert parallelism (ep > 1)", f));
    if (f == "moe-mc2-chunks") {
      if (b.moe.dispatcher != MoeDispatcher::kMc2) return skip("--moe-mc2-chunks: needs --ep-dispatcher mc2");
      std::vector<Keys> options;
      for (int c : {1, 4})
        if (c != ctx.start->moe.mc2_chunks && c != b.moe.mc2_chunks)
          options.push_back({{"moe-mc2-chunks", std::to_string(c)}});
      return first_untried(f, "ep", options, tried);
    }
    // mc2 comes with each chunk count of the chunks family, the run's first: its gain lies in the chunks, and one
    // switch at a time would otherwise judge mc2 at a count where it does not pay and never reach the chunks family,
    // which needs mc2 kept (from eager at one chunk on the shaped cluster: mc2 0.99-1.04x, with 4 chunks 1.11x;
    // docs/performance.md point 40).
    std::vector<Keys> options;
    for (MoeDispatcher d : {MoeDispatcher::kFused, MoeDispatcher::kMc2, MoeDispatcher::kEager}) {
      if (d == ctx.start->moe.dispatcher || d == b.moe.dispatcher) continue;
      options.push_back({{"ep-dispatcher", to_string(d)}});
      if (d != MoeDispatcher::kMc2) continue;
      for (int c : {4, 1})
        if (c != b.moe.mc2_chunks) options.push_back({{"ep-dispatcher", "mc2"}, {"moe-mc2-chunks", std::to_string(c)}});
    }
    return first_untried(f, "ep", options, tried);
  }
  if (f == "use-cp-send-recv-overlap") {
    if (b.context_parallel_size <= 1) return skip("--use-cp-send-recv-overlap: needs context parallelism (cp > 1)");
    if (b.cp_send_recv_overlap) return tried.empty() ? skip("already on") : NextCandidate{{}, "", true};
    return first_untried(f, "cp", {{{"use-cp-send-recv-overlap", "true"}}}, tried);
  }
  if (f == "cp-window-size") {
    const int cp = b.context_parallel_size;
    if (cp <= 1) return skip("--cp-window-size: needs context parallelism (cp > 1)");
    if (!ctx.allow_math_change)
      return skip("--cp-window-size: another window sums the ring's blocks in another order (not bitwise under "
                  "--deterministic); pass --allow-math-change to try it");
    std::vector<Keys> options;  // every window that divides cp (a double ring), by whole runs
    for (int w = 1; w <= cp; ++w)
      if (cp % w == 0 && w != ctx.start->cp_window_size && w != b.cp_window_size)
        options.push_back({{"cp-window-size", std::to_string(w)}});
    return first_untried(f, "cp", options, tried, /*math_change=*/true);
  }
  if (f == "data-parallel-sharding-strategy") {
    if (ctx.replicas <= 1)
      return skip("--data-parallel-sharding-strategy: needs data or context parallelism (dp × cp > 1)");
    // Every strategy gives no_shard's bits under --deterministic (docs/semantics.md), so no math change; whole runs.
    std::vector<Keys> options;
    for (ShardingStrategy st : {ShardingStrategy::kOptim, ShardingStrategy::kOptimGrads,
                                ShardingStrategy::kOptimGradsParams, ShardingStrategy::kNoShard})
      if (st != ctx.start->data_parallel_sharding_strategy && st != b.data_parallel_sharding_strategy)
        options.push_back({{"data-parallel-sharding-strategy", to_string(st)}});
    return first_untried(f, "dp", options, tried);
  }
  if (f == "micro-batch-size") {
    if (!ctx.allow_math_change)
      return skip("--micro-batch-size: another size accumulates the gradients over other micro-batches (not bitwise "
                  "under --deterministic); pass --allow-math-change to try it");
    // The global batch stays: half and twice the micro-batch, where they divide a data-parallel rank's share.
    const int64_t dp = std::max(1, ctx.replicas / std::max(1, b.context_parallel_size));
    const int64_t share = b.global_batch_size / dp, m = b.micro_batch_size;
    std::vector<Keys> options;
    for (int64_t c : {m / 2, m * 2})
      if (c >= 1 && share % c == 0 && c != ctx.start->micro_batch_size)
        options.push_back({{"micro-batch-size", std::to_string(c)}});
    if (options.empty())
      return tried.empty() ? skip(fmt::format("--micro-batch-size: neither {} nor {} divides a data-parallel rank's "
                                              "{} sequences per iteration", m / 2, m * 2, share))
                           : NextCandidate{{}, "", true};
    return first_untried(f, "", options, tried, /*math_change=*/true);
  }
  if (f == "overlap-grad-reduce") {
    if (ctx.replicas <= 1) return skip("--overlap-grad-reduce: needs data or context parallelism (dp × cp > 1)");
    if (b.data_parallel_sharding_strategy != ShardingStrategy::kNoShard)
      return skip("--overlap-grad-reduce: the sharded strategies always overlap their reduce-scatters");
    if (b.overlap_grad_reduce) return tried.empty() ? skip("already on") : NextCandidate{{}, "", true};
    return first_untried(f, "dp", {{{"overlap-grad-reduce", "true"}}}, tried);
  }
  if (f == "overlap-p2p-communication") {
    if (ctx.pipeline <= 1)
      return skip("--overlap-p2p-communication: needs pipeline parallelism (--pipeline-model-parallel-size > 1)");
    if (b.overlap_p2p_communication) return tried.empty() ? skip("already on") : NextCandidate{{}, "", true};
    return first_untried(f, "pp", {{{"overlap-p2p-communication", "true"}}}, tried);
  }
  if (f == "bf16" || f == "grad-reduce-in-bf16") return precision_family(f, b, ctx, tried);
  if (f == "layout") return layout_family(b, ctx, tried);
  if (f == "recompute-granularity") return recompute_family(b, ctx, tried);
  if (f == "comm-engine") {
    if (ctx.world <= 1) return skip("--comm-engine: needs more than one rank");
    return first_untried(f, "", {{{"comm-engine", ctx.engine == "thread" ? "inline" : "thread"}}}, tried);
  }
  if (f == "comm-nonblocking-impl") {
    if (ctx.world <= 1) return skip("--comm-nonblocking-impl: needs more than one rank");
    // MPI's reduce-scatter sums in the library's order, coc's p2p one in rank order: another rounding at tp > 2.
    if (!ctx.allow_math_change)
      return skip("--comm-nonblocking-impl: MPI's reduce-scatter sums in its own order (not bitwise equal to coc's "
                  "rank order); pass --allow-math-change to try it");
    return first_untried(f, "", {{{"comm-nonblocking-impl", ctx.nonblocking_impl == "mpi" ? "p2p" : "mpi"}}}, tried,
                         /*math_change=*/true);
  }
  if (f == "gemm-backend") {
    if (!ctx.allow_math_change)
      return skip("--gemm-backend: the other library's GEMMs round differently (not bitwise under --deterministic); "
                  "pass --allow-math-change to try it");
    const GemmBackend now = ctx.start->gemm_backend.value_or(gemm_backend());
    const char* other = now == GemmBackend::kOpenBlas ? "onednn" : "openblas";
    return first_untried(f, "", {{{"gemm-backend", other}}}, tried, /*math_change=*/true);
  }
  return tp_family(f, b, ctx, tried);
}

double keep_threshold(double iqr) { return 1 + std::max(0.02, iqr / 2); }

std::string Candidate::label() const {
  std::string s = family == "second look" ? "second look:" : "";  // Tuner::second_look's step, named in the report
  for (const auto& [k, v] : keys) {
    if (!s.empty()) s += ' ';
    if (v == "true") s += "--" + k;
    else if (v == "false") s += "--" + k + "=false";
    else s += "--" + k + ' ' + v;
  }
  return s;
}

}  // namespace coc::cli
