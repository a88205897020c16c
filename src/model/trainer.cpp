#include "coc/model/trainer.h"

#include <unistd.h>

#include <chrono>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <span>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "coc/comm/mesh.h"
#include "coc/comm/process.h"
#include "coc/core/env_registry.h"
#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/kernels/blas_core.h"
#include "coc/kernels/gemm.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/model/checkpoint.h"
#include "coc/model/dataset.h"
#include "coc/parallel/ring_attention.h"
#include "coc/model/decoder.h"
#include "coc/model/pipeline_schedule.h"
#include "coc/model/gpt_dataset.h"
#include "coc/model/safetensors.h"
#include "coc/model/tokenizer.h"
#include "coc/overlap/coc_ops.h"
#include "coc/overlap/tuning_cache.h"
#include "coc/parallel/context.h"
#include "coc/parallel/fsdp.h"
#include "coc/parallel/gradient_sync.h"
#include "coc/runtime/memory.h"

namespace coc {

namespace {

using Clock = std::chrono::steady_clock;

int64_t mem_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return -1;
}

/// Bytes of activations one rank keeps for backward (fp32 buffers; the attention probabilities in bf16 under
/// --bf16), a rough upper bound used to refuse batches that do not fit before allocating them. Under recomputation
/// (Decoder::set_recompute) the recomputed layers share as many layer slots as the longest chunk has layers and keep
/// one [m, H] input per chunk; selective keeps one layer's attention probabilities in all.
int64_t activation_bytes(const ModelConfig& c, int64_t mbs, int tp, const RecomputeConfig& r, bool bf16) {
  const int64_t m = c.seq_length * mbs, H = c.hidden_size, F = c.ffn_hidden_size / tp, Hl = H / tp;
  const int64_t probs = attention_prob_floats(mbs, c.num_attention_heads / tp, c.seq_length,
                                              bf16 ? DType::kBF16 : DType::kF32);
  const int64_t rows = m * (6 * H + 3 * Hl + Hl + 2 * F + F + 2 * H);
  int64_t layers = 0, slots = 0, checkpoints = 0;
  for (const LayerChunk& ch : recompute_chunks(static_cast<int>(c.num_layers), r)) {
    if (!ch.recompute) layers += ch.end - ch.begin;
    if (ch.recompute) slots = std::max<int64_t>(slots, ch.end - ch.begin);
    checkpoints += ch.recompute ? 1 : 0;
  }
  const bool selective = r.granularity == RecomputeGranularity::kSelective;
  const int64_t dense = (layers + slots) * (rows + (selective ? 0 : probs)) + (selective ? probs : 0) +
                        checkpoints * m * H;
  // A MoE layer keeps, per routed slot (about m·K rows over the ep group), its input, gate|up, SwiGLU output and
  // expert output instead of the dense MLP's rows.
  int64_t moe = 0;
  for (int64_t i = 0; i < c.num_layers; ++i)
    if (c.moe_layer(i)) moe += m * c.moe_router_topk * (2 * H + 3 * c.moe_ffn()) + m * c.num_experts;
  return 4 * (dense + moe + 3 * m * c.vocab_size / tp + 4 * m * H);
}

/// Whether attention runs through the ring (parallel/ring_attention.h): context parallelism, or the general mask
/// (which only the ring's block kernel has).
bool uses_ring_attention(const TrainConfig& c) {
  return c.context_parallel_size > 1 || c.attention_mask != AttnMask::kCausal;
}

/// The CoC settings of the baseline side (TrainConfig::baseline): its switchable flags over this run's sequence
/// parallelism and determinism, which are built once.
OverlapConfig baseline_overlap(const TrainConfig& c) {
  OverlapConfig o = c.baseline->overlap();
  o.sequence_parallel = c.sequence_parallel;
  o.deterministic = c.deterministic;
  o.vocab_comm = c.vocab_comm;
  return o;
}

/// The model as one cp rank runs it: S / CP local positions (its two zig-zag chunks).
ModelConfig local_model(const TrainConfig& c) {
  ModelConfig m = c.model;
  if (c.context_parallel_size > 1) m.seq_length /= c.context_parallel_size;
  return m;
}

/// --pipeline-model-parallel-size: the layer split (pipeline_stage_layers' errors), the flags that need pp > 1, and
/// --recompute-num-layers against the layers of one (virtual) stage, on either side of --baseline (kInvalidArgument,
/// one line each).
void validate_pipeline(const TrainConfig& c) {
  const int pp = c.pipeline_model_parallel_size;
  if (pp < 1) throw_invalid("--pipeline-model-parallel-size must be >= 1 (got {})", pp);
  const std::vector<int> layers =
      pipeline_virtual_stage_layers(static_cast<int>(c.model.num_layers), pp, c.pipeline_split);
  if (pp == 1) {
    if (c.overlap_p2p_communication || (c.baseline && c.baseline->overlap_p2p_communication))
      throw_invalid("--overlap-p2p-communication overlaps the pipeline's stage transfers: it needs "
                    "--pipeline-model-parallel-size > 1");
    return;
  }
  // Megatron's rule: under pipelining --recompute-num-layers counts the layers of one stage, and under interleaving
  // those of one virtual stage (Megatron-core's TransformerBlock of one model chunk).
  const int fewest = *std::min_element(layers.begin(), layers.end());
  const bool interleaved = c.pipeline_split.virtual_stages > 1;
  for (const RecomputeConfig* r : {&c.recompute, c.baseline ? &c.baseline->recompute : nullptr})
    if (r && r->granularity == RecomputeGranularity::kFull && r->num_layers.value_or(1) > fewest)
      throw_invalid("--recompute-num-layers {} counts the layers of one pipeline {}: pass at most {}, the fewest "
                    "layers a {} holds under --pipeline-model-parallel-size {}{}",
                    *r->num_layers, interleaved ? "virtual stage (model chunk)" : "stage", fewest,
                    interleaved ? "virtual stage" : "stage", pp,
                    interleaved ? fmt::format(" × --num-virtual-stages-per-pipeline-rank {}",
                                              c.pipeline_split.virtual_stages)
                                : std::string());
}

namespace {
/// --overlap-forward-micro-batches on either side of the run (the second slot is kept for both).
bool pairs_forwards(const TrainConfig& c) {
  return c.overlap_forward_micro_batches || (c.baseline && c.baseline->overlap_forward_micro_batches);
}

/// For fewer than two micro-batches per iteration: the largest smaller micro-batch size that gives two or more and
/// divides a data-parallel rank's share of the global batch, or how to raise the global batch.
std::string two_micro_batches_fix(int64_t global, int64_t micro, int dp) {
  for (int64_t m = micro - 1; m >= 1; --m)
    if (global % (m * dp) == 0 && global / (m * dp) >= 2)
      return fmt::format("use --micro-batch-size {} ({} micro-batches per iteration, the same sequences)", m,
                         global / (m * dp));
  return fmt::format("raise --global-batch-size to a multiple of {} of at least {}", micro * dp, 2 * micro * dp);
}

/// --overlap-forward-micro-batches' conditions (TrainConfig::overlap_forward_micro_batches), one line each naming
/// the flag it meets and the fix; `s` is the run's config or, `baseline`, its --baseline side (which inherits the
/// run's flags), on `dp` data-parallel ranks.
void validate_forward_overlap(const TrainConfig& s, int dp, bool baseline) {
  if (!s.overlap_forward_micro_batches) return;
  const int64_t micro_batches = s.global_batch_size / (s.micro_batch_size * dp);
  const auto refuse = [baseline](const std::string& why, const std::string& fix) {
    if (baseline)
      throw_invalid("coc bench train --baseline: on the baseline's side --overlap-forward-micro-batches {}; {}, or "
                    "give --baseline \"--no-overlap-forward-micro-batches\" (that side inherits the run's flags)",
                    why, fix);
    throw_invalid("--overlap-forward-micro-batches {}; {}", why, fix);
  };
  if (micro_batches < 2)
    refuse(fmt::format("needs two or more micro-batches per iteration, but --global-batch-size {} / "
                       "(--micro-batch-size {} × data-parallel size {}) gives {}",
                       s.global_batch_size, s.micro_batch_size, dp, micro_batches),
           two_micro_batches_fix(s.global_batch_size, s.micro_batch_size, dp));
  if (s.pipeline_model_parallel_size > 1)
    refuse(fmt::format("with --pipeline-model-parallel-size {} is not supported (a stage runs its micro-batches in "
                       "the 1F1B order)", s.pipeline_model_parallel_size),
           "drop one of them");
  if (uses_ring_attention(s))
    refuse("with ring attention (--context-parallel-size > 1 or --attention-mask-type general) is not supported",
           "drop one of them");
  if (s.model.is_moe())
    refuse(fmt::format("with --num-experts {} is not supported (MoE layers)", s.model.num_experts),
           "drop one of them");
  if (s.recompute.granularity != RecomputeGranularity::kNone)
    refuse(fmt::format("with recomputation (--recompute-granularity {}, or --recompute-activations) is not "
                       "supported",
                       to_string(s.recompute.granularity)),
           "drop one of them");
  if (s.data_parallel_sharding_strategy != ShardingStrategy::kNoShard)
    refuse("with a sharded --data-parallel-sharding-strategy is not supported (its module hooks gather per "
           "micro-batch)",
           "use no_shard or drop the flag");
}
}  // namespace

void validate(const TrainConfig& c, int world) {
  const int tp = c.tensor_model_parallel_size;
  if (tp < 1) throw_invalid("--tensor-model-parallel-size must be >= 1 (got {})", tp);
  if (world % tp != 0)
    throw_invalid("world size {} is not divisible by --tensor-model-parallel-size {}; launch a multiple of {} ranks "
                  "(scripts/launch -n {} -- ...) or change the tp size",
                  world, tp, tp, tp);
  c.overlap().validate();
  if (c.vocab_comm == VocabComm::kWeights && (!c.sequence_parallel || tp == 1))
    throw_invalid("--vocab-parallel-comm weights needs --sequence-parallel and --tensor-model-parallel-size > 1 (got "
                  "sequence parallelism {}, tp {}): without them every rank holds every row and the vocabulary "
                  "layers send no activations to replace; drop the flag or use auto",
                  c.sequence_parallel ? "on" : "off", tp);
  if (c.micro_batch_size < 1) throw_invalid("--micro-batch-size must be >= 1 (got {})", c.micro_batch_size);
  if (c.global_batch_size < 1) throw_invalid("--global-batch-size must be >= 1 (got {})", c.global_batch_size);
  const int cp = c.context_parallel_size;
  const int ep = c.expert_model_parallel_size;
  if (ep != 1 && !c.model.is_moe())
    throw_invalid("--expert-model-parallel-size {} needs a MoE model: pass --num-experts E (a multiple of {})", ep,
                  ep);
  // The mesh's own size checks (ep must divide dp × cp), before any group.
  const int pp = c.pipeline_model_parallel_size;
  const int dp = mesh_dense_dp(world, {.tp = tp, .cp = cp, .ep = ep, .pp = pp});
  validate_pipeline(c);
  if (uses_ring_attention(c)) check_ring_attention_sizes(c.model.seq_length, cp, c.cp_window_size);
  if (cp > 1 && c.model.kv_heads() != c.model.num_attention_heads)
    throw_invalid("--group-query-attention with --context-parallel-size {} is not supported yet: the ring passes "
                  "one key/value head per query head; use --context-parallel-size 1 or no grouped-query attention",
                  cp);
  if (c.attention_mask != AttnMask::kCausal && c.model.kv_heads() != c.model.num_attention_heads)
    throw_invalid("--group-query-attention with --attention-mask-type general is not supported yet: the general mask "
                  "runs the ring's block attention, which takes one key/value head per query head; use "
                  "--attention-mask-type causal or no grouped-query attention");
  if (c.global_batch_size % (c.micro_batch_size * dp) != 0)
    throw_invalid("--global-batch-size {} is not divisible by --micro-batch-size {} × data-parallel size {} (= world "
                  "{} / tp {} / cp {}{}); use a global batch that is a multiple of {}",
                  c.global_batch_size, c.micro_batch_size, dp, world, tp, cp,
                  pp > 1 ? fmt::format(" / pp {}", pp) : std::string(), c.micro_batch_size * dp);
  if (c.train_iters < 0) throw_invalid("--train-iters must be >= 0 (got {})", c.train_iters);
  if (c.log_interval < 1) throw_invalid("--log-interval must be >= 1 (got {})", c.log_interval);
  if (c.save_interval < 0) throw_invalid("--save-interval must be >= 0 (got {})", c.save_interval);
  if (c.save_interval > 0 && c.save.empty())
    throw_invalid("--save-interval {} needs --save DIR to know where to write checkpoints", c.save_interval);
  if (c.sample_length < 0) throw_invalid("--sample-length must be >= 0 (got {})", c.sample_length);
  if (!(c.sample_temperature > 0)) throw_invalid("--sample-temperature must be > 0");
  if (c.eval_interval < 0 || c.eval_iters < 0)
    throw_invalid("--eval-interval and --eval-iters must be >= 0 (got {} and {})", c.eval_interval, c.eval_iters);
  if (c.exit_interval < 0) throw_invalid("--exit-interval must be >= 0 (got {}; 0: never)", c.exit_interval);
  if (!(c.exit_duration_mins >= 0))
    throw_invalid("--exit-duration-in-mins must be >= 0 (got {}; 0: no limit)", c.exit_duration_mins);
  if (c.skip_train && c.eval_iters == 0)
    throw_invalid("--skip-train evaluates only: pass --eval-iters K > 0 (and --split with a validation part)");
  c.model.validate(tp);
  if (c.model.is_moe()) {
    MoeConfig m = c.moe;
    m.hidden = c.model.hidden_size;
    m.ffn_hidden = c.model.moe_ffn();
    m.num_experts = static_cast<int>(c.model.num_experts);
    m.topk = static_cast<int>(c.model.moe_router_topk);
    check_moe_config(m, ep);
    if (c.sequence_parallel && tp > 1)
      throw_invalid("--num-experts {} with --sequence-parallel and --tensor-model-parallel-size {} is not supported: "
                    "the MoE layers run on the rows every TP rank holds; drop --sequence-parallel (or use tp 1)",
                    c.model.num_experts, tp);
  }
  coc::validate(c.optim);
  validate_prefetch(c.num_to_forward_prefetch, c.num_to_backward_prefetch);
  if (c.baseline) validate_prefetch(c.baseline->num_to_forward_prefetch, c.baseline->num_to_backward_prefetch);
  c.recompute.validate(static_cast<int>(c.model.num_layers));
  if (c.baseline) c.baseline->recompute.validate(static_cast<int>(c.model.num_layers));
  validate_forward_overlap(c, dp, false);
  if (c.baseline) validate_forward_overlap(*c.baseline, dp, true);
  // Under --baseline, the side that keeps more; two micro-batches' worth under --overlap-forward-micro-batches.
  const auto side_bytes = [&](const TrainConfig& s) {
    return activation_bytes(local_model(c), c.micro_batch_size, tp, s.recompute, s.bf16) *
           (pairs_forwards(c) ? 2 : 1);
  };
  const int64_t acts = std::max(side_bytes(c), c.baseline ? side_bytes(*c.baseline) : 0);
  const int64_t need = acts + 3 * 4 * c.model.num_parameters() / tp * 2;  // params, grads, Adam m and v
  const int64_t avail = mem_available_bytes();
  if (avail > 0 && need > avail)
    throw_invalid("--seq-length {} × --micro-batch-size {} does not fit: each rank needs about {:.1f} GiB of "
                  "activations and optimizer state but {:.1f} GiB is available; {}lower --micro-batch-size or "
                  "--seq-length, raise --tensor-model-parallel-size{}",
                  c.model.seq_length, c.micro_batch_size, need / 1073741824.0, avail / 1073741824.0,
                  pairs_forwards(c) ? "drop --overlap-forward-micro-batches (it keeps two micro-batches' "
                                      "activations), "
                                    : "",
                  pairs_forwards(c) ? "" : ", or recompute activations (--recompute-granularity full "
                                           "--recompute-method uniform --recompute-num-layers 1)");
}

/// The start-up line of a run with recomputation: what is recomputed, and that selective changes nothing where
/// attention runs through the ring (which keeps no probabilities).
std::string describe_recompute(const TrainConfig& c) {
  const RecomputeConfig& r = c.recompute;
  if (r.granularity == RecomputeGranularity::kSelective)
    return uses_ring_attention(c) ? "recompute: selective (ring attention keeps no attention probabilities: nothing to "
                                    "recompute)"
                                  : "recompute: selective (the attention probabilities of every layer)";
  // Each (virtual) pipeline stage applies the flags to its own layers (Decoder::set_recompute).
  const int pp = c.pipeline_model_parallel_size;
  int recomputed = 0;
  for (int layers : pipeline_virtual_stage_layers(static_cast<int>(c.model.num_layers), pp, c.pipeline_split))
    for (const LayerChunk& ch : recompute_chunks(layers, r)) recomputed += ch.recompute ? ch.end - ch.begin : 0;
  return fmt::format("recompute: full, --recompute-method {} --recompute-num-layers {}{}: {} of {} layers recomputed "
                     "in backward",
                     to_string(*r.method), *r.num_layers,
                     pp == 1                              ? ""
                     : c.pipeline_split.virtual_stages > 1 ? " per virtual stage"
                                                           : " per stage",
                     recomputed, c.model.num_layers);
}

/// The start-up line of a pipeline-parallel run: the stages' layers, the micro-batches and the schedule. The ideal
/// bubble is (P - 1)/(M + P - 1) for 1F1B and (P - 1)/(V·M + P - 1) interleaved (Narayanan et al. 2021, §2.2.1:
/// the bubble time (P - 1)·(t_f + t_b)/V against the ideal M·(t_f + t_b)).
std::string describe_pipeline(const TrainConfig& c, int pp, int64_t micro_batches) {
  const std::vector<int> layers =
      pipeline_virtual_stage_layers(static_cast<int>(c.model.num_layers), pp, c.pipeline_split);
  const int V = c.pipeline_split.virtual_stages;
  std::string split;
  for (int s = 0; s < pp; ++s) {
    split += s ? ", " : "";
    for (int ch = 0; ch < V; ++ch) {  // stage s, chunk ch: virtual stage ch·P + s
      int first = 0;
      for (int u = 0; u < ch * pp + s; ++u) first += layers[static_cast<size_t>(u)];
      split += fmt::format("{}{}-{}", ch ? "+" : "", first, first + layers[static_cast<size_t>(ch * pp + s)] - 1);
    }
  }
  const double bubble = static_cast<double>(pp - 1) / static_cast<double>(V * micro_batches + pp - 1);
  const std::string schedule =
      V > 1 ? fmt::format("interleaved 1F1B ({} virtual stages per rank) over {} micro-batches (bubble "
                          "(P-1)/(V·M+P-1) = {:.0f}%)",
                          V, micro_batches, 100 * bubble)
            : fmt::format("1F1B over {} micro-batches (bubble (P-1)/(M+P-1) = {:.0f}%)", micro_batches, 100 * bubble);
  auto on_off = [](bool b) { return b ? "on" : "off"; };
  const bool switched = c.baseline && c.baseline->overlap_p2p_communication != c.overlap_p2p_communication;
  return fmt::format("pipeline: {} stages (layers {}; embedding on stage 0, head and loss on stage {}), {}, "
                     "--overlap-p2p-communication {}{}",
                     pp, split, pp - 1, schedule, on_off(c.overlap_p2p_communication),
                     switched ? fmt::format(" (the baseline's: {})", on_off(c.baseline->overlap_p2p_communication))
                              : std::string());
}

namespace {
using nlohmann::ordered_json;

/// A float or double as typed: 0.1f is "0.1", not 0.10000000149011612.
template <typename F>
std::string as_typed(F v) {
  return fmt::format("{}", v);
}

/// config_parts' groups, one key per flag. The data, the run's length and its end, checkpoints (a barrier and
/// gathers) and sampling: collective too.
ordered_json run_flags(const TrainConfig& c) {
  return {{"--train-iters", c.train_iters},
          {"--seed", c.seed},
          {"--micro-batch-size", c.micro_batch_size},
          {"--global-batch-size", c.global_batch_size},
          {"--seq-length", c.model.seq_length},
          {"--data-path", c.data_path},
          {"--split", c.split},
          {"--tokenizer-type", c.tokenizer_type},
          {"--tokenizer-model", c.tokenizer_model},
          {"--eval-interval", c.eval_interval},
          {"--eval-iters", c.eval_iters},
          {"--skip-train", c.skip_train},
          {"--save", c.save},  // the path: one rank's shards elsewhere would not resume
          {"--save-interval", c.save_interval},
          {"--load", c.load},
          {"--no-load-optim", !c.load_optim},
          {"--finetune", c.finetune},
          {"--exit-interval", c.exit_interval},
          {"--exit-duration-in-mins", as_typed(c.exit_duration_mins)},
          {"--sample-length", c.sample_length},
          {"--sample-prompt", c.sample_prompt},
          {"--sample-temperature", as_typed(c.sample_temperature)},
          {"--logits-out", !c.logits_out.empty()}};
}

ordered_json model_flags(const TrainConfig& c) {
  const ModelConfig& m = c.model;
  ordered_json model = {{"--num-layers", m.num_layers},
                        {"--hidden-size", m.hidden_size},
                        {"--num-attention-heads", m.num_attention_heads},
                        {"--ffn-hidden-size", m.ffn_hidden_size},
                        {"--num-query-groups", m.num_query_groups},
                        {"--num-experts", m.num_experts},
                        {"--init-method-std", as_typed(m.init_method_std)},
                        {"--norm-epsilon", as_typed(m.norm_epsilon)},
                        {"--rotary-base", as_typed(m.rotary_base)},
                        {"--fp32-residual-connection", m.fp32_residual_connection},
                        {"the padded vocabulary size, from the tokenizer and --make-vocab-size-divisible-by",
                         m.vocab_size}};
  if (m.is_moe())
    model.update(ordered_json{{"--moe-router-topk", m.moe_router_topk},
                              {"--moe-ffn-hidden-size", m.moe_ffn()},
                              {"--moe-layer-freq", m.moe_layer_freq},
                              {"--first-k-dense-replace", m.moe_first_k_dense},
                              {"--expert-model-parallel-size", c.expert_model_parallel_size},
                              {"--moe-expert-capacity-factor", as_typed(c.moe.capacity_factor)},
                              {"--moe-aux-loss-coeff", as_typed(c.moe.aux_loss_coeff)},
                              {"--ep-dispatcher", to_string(c.moe.dispatcher)},
                              {"--moe-mc2-chunks", c.moe.mc2_chunks},
                              {"--moe-fixed-router", to_string(c.moe.fixed_router)}});
  return model;
}

ordered_json layout_flags(const TrainConfig& c, int world) {
  return {{"--tensor-model-parallel-size", c.tensor_model_parallel_size},
          {"--context-parallel-size", c.context_parallel_size},
          {"--cp-window-size", c.cp_window_size},
          {"--attention-mask-type", static_cast<int>(c.attention_mask)},
          {"--use-cp-send-recv-overlap", c.cp_send_recv_overlap},
          {"--sequence-parallel", c.sequence_parallel},
          {"--pipeline-model-parallel-size", c.pipeline_model_parallel_size},
          {"--decoder-first-pipeline-num-layers", c.pipeline_split.first_stage_layers},
          {"--decoder-last-pipeline-num-layers", c.pipeline_split.last_stage_layers},
          {"--num-virtual-stages-per-pipeline-rank", c.pipeline_split.virtual_stages},
          {"--overlap-p2p-communication", c.overlap_p2p_communication},
          {"--data-parallel-sharding-strategy", to_string(c.data_parallel_sharding_strategy)},
          {"--num-to-forward-prefetch", c.num_to_forward_prefetch},
          {"--num-to-backward-prefetch", c.num_to_backward_prefetch},
          {"--overlap-grad-reduce", c.overlap_grad_reduce},
          {"--grad-reduce-in-bf16", c.grad_reduce_in_bf16},
          {"the world size", world}};
}

/// The switches that change which collectives run, or their order (recomputation too: a recomputed ring or MoE layer
/// communicates again): ranks that disagree on one would hang in a mismatched collective instead of failing here.
ordered_json overlap_flags(const TrainConfig& c) {
  return {{"--coc-parallel-num",
           c.coc_parallel_num == CocOptions::kAuto ? ordered_json("auto") : ordered_json(c.coc_parallel_num)},
          {"--coc-comm-algo", to_string(c.coc_comm_algo)},
          {"--customized-coc", c.customized_coc},
          {"--coc-tuning-cache", c.coc_tuning_cache},
          {"--deterministic", c.deterministic},
          {"--coc-fused-kernel", c.coc_fused_kernel},
          {"--use-mc2", c.use_mc2},
          {"--tp-comm-bulk-wgrad", c.tp_comm_bulk_wgrad},
          {"--delay-wgrad-compute", c.delay_wgrad_compute},
          {"--delay-column-wgrad", c.delay_column_wgrad},
          {"--attention-dense-pipeline", c.attention_dense_pipeline},
          {"--attention-dense-backward-pipeline", c.attention_dense_backward_pipeline},
          {"--swiglu-down-pipeline", c.swiglu_down_pipeline},
          {"--attention-qkv-backward-pipeline", c.attention_qkv_backward_pipeline},
          {"--swiglu-down-backward-pipeline", c.swiglu_down_backward_pipeline},
          {"--vocab-parallel-comm", to_string(c.vocab_comm)},
          {"--coc-min-chunk-rows", c.coc_min_chunk_rows},
          {"--overlap-forward-micro-batches", c.overlap_forward_micro_batches},
          {"--recompute-granularity", to_string(c.recompute.granularity)},
          {"--recompute-method", c.recompute.method ? to_string(*c.recompute.method) : "none"},
          {"--recompute-num-layers", c.recompute.num_layers.value_or(0)}};
}

ordered_json precision_flags(const TrainConfig& c) {
  return {{"--bf16", c.bf16},
          {"--fp16", c.fp16},
          {"--loss-scale", c.loss_scale.constant ? as_typed(*c.loss_scale.constant) : "none (dynamic)"},
          {"--initial-loss-scale", as_typed(c.loss_scale.initial)},
          {"--min-loss-scale", as_typed(c.loss_scale.min)},
          {"--loss-scale-window", c.loss_scale.window},
          {"--hysteresis", c.loss_scale.hysteresis}};
}

/// Not collectives, but ranks that disagree would train different shards of one model. The iteration counts last:
/// they follow from --train-iters when not given.
ordered_json optimizer_flags(const OptimizerConfig& o) {
  return {{"--lr", as_typed(o.lr)},
          {"--min-lr", as_typed(o.min_lr)},
          {"--weight-decay", as_typed(o.weight_decay)},
          {"--clip-grad", as_typed(o.clip_grad)},
          {"--adam-beta1", as_typed(o.beta1)},
          {"--adam-beta2", as_typed(o.beta2)},
          {"--adam-eps", as_typed(o.eps)},
          {"--lr-warmup-init", as_typed(o.init_lr)},
          {"--lr-decay-style", to_string(o.decay_style)},
          {"--lr-wsd-decay-style", to_string(o.wsd_style)},
          {"--lr-wsd-decay-iters", o.wsd_decay_iters},
          {"--lr-warmup-iters", as_typed(o.warmup_iters)},
          {"--lr-decay-iters", as_typed(o.decay_iters)}};
}
}  // namespace

/// The settings every rank must share, keyed by the flags that set them (check_same_config names the flags that
/// differ): the model, the layout, the data, and every switch that changes which collectives run or their order.
/// The groups go from what a user types to what follows from it (the schedule's iteration counts from
/// --train-iters, tp from the heads), so that the flag given is named first.
nlohmann::ordered_json config_parts(const TrainConfig& c, int world) {
  ordered_json j = {{"run", run_flags(c)},
                    {"model", model_flags(c)},
                    {"layout", layout_flags(c, world)},
                    {"overlap", overlap_flags(c)},
                    {"precision", precision_flags(c)},
                    {"optimizer", optimizer_flags(c.optim)}};
  if (c.baseline)
    j["--baseline"] = {overlap_flags(*c.baseline),           c.baseline->cp_send_recv_overlap,
                       c.baseline->num_to_forward_prefetch,  c.baseline->num_to_backward_prefetch,
                       c.baseline->overlap_grad_reduce,      to_string(c.baseline->moe.dispatcher),
                       c.baseline->moe.mc2_chunks,           c.baseline->bf16,
                       c.baseline->overlap_p2p_communication};
  return j;
}

/// The flags of `a` and `b` (config_parts of two ranks, with extras) whose values differ, with both values, in
/// config_parts' order, at most three; "" if none.
std::string describe_difference(const nlohmann::ordered_json& a_groups, const nlohmann::ordered_json& b_groups,
                                int rank) {
  using nlohmann::ordered_json;
  const auto flatten = [](const ordered_json& groups) {
    ordered_json flat = ordered_json::object();
    for (const auto& [key, value] : groups.items())
      if (value.is_object())
        for (const auto& [flag, v] : value.items()) flat[flag] = v;
      else
        flat[key] = value;
    return flat;
  };
  const auto shown = [](const ordered_json* v) {
    if (!v) return std::string("(absent)");
    std::string s = v->is_string()         ? (v->get<std::string>().empty() ? "(none)" : v->get<std::string>())
                    : v->is_number_float() ? fmt::format("{}", v->get<double>())
                                           : v->dump();
    return s.size() > 60 ? s.substr(0, 57) + "..." : s;
  };
  const ordered_json a = flatten(a_groups), b = flatten(b_groups);
  ordered_json keys = a;  // a's flags in order, then any only b has
  for (const auto& [key, v] : b.items())
    if (!keys.contains(key)) keys[key] = v;
  std::vector<std::string> diffs;
  for (const auto& [key, unused] : keys.items()) {
    const ordered_json* va = a.contains(key) ? &a.at(key) : nullptr;
    const ordered_json* vb = b.contains(key) ? &b.at(key) : nullptr;
    if (va && vb && *va == *vb) continue;
    diffs.push_back(fmt::format("{} (rank 0: {}, rank {}: {})", key, shown(va), rank, shown(vb)));
  }
  if (diffs.size() > 3) {
    const size_t more = diffs.size() - 3;
    diffs.resize(3);
    diffs.back() += fmt::format(" and {} more", more);
  }
  return fmt::format("{}", fmt::join(diffs, "; "));
}
}  // namespace

bool same_training_settings(const TrainConfig& a, const TrainConfig& b) {
  return config_parts(a, 1) == config_parts(b, 1) && a.gemm_backend == b.gemm_backend;
}

void check_same_config(Communicator& world, const TrainConfig& c,
                       const std::vector<std::pair<std::string, std::string>>& extra) {
  nlohmann::ordered_json parts = config_parts(c, world.size());
  for (const auto& [key, value] : extra) parts[key] = value;
  const std::string mine = parts.dump();
  const std::vector<uint64_t> all = world.all_gather_value(fnv1a(mine.data(), mine.size()), "configuration hash");
  int first = 0;
  for (int r = 1; r < world.size() && first == 0; ++r)
    if (all[static_cast<size_t>(r)] != all[0]) first = r;
  if (first == 0) return;
  // Which flags: rank 0 compares its settings with the first differing rank's, and tells every rank.
  const std::vector<std::string> texts = world.gather_bytes(mine, 0, "configuration");
  std::string what;
  if (world.rank() == 0)
    what = describe_difference(nlohmann::ordered_json::parse(texts[0]),
                               nlohmann::ordered_json::parse(texts[static_cast<size_t>(first)]), first);
  what = world.broadcast_string(what, 0, "configuration");
  throw Error(ErrorKind::kInvalidArgument,
              fmt::format("ranks disagree on the training configuration (flags and config file): rank {} differs "
                          "from rank 0 in {}. Launch every rank with the same flags, config file and data",
                          first, what.empty() ? "settings coc could not name" : what),
              /*uniform=*/true);
}

namespace {
std::string progress_bar(int64_t done, int64_t total, double eta_s) {
  const int width = 30;
  int filled = total > 0 ? static_cast<int>(width * done / total) : width;
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < width) bar += '>' + std::string(static_cast<size_t>(width - filled - 1), ' ');
  return fmt::format("[{}] {}/{} eta {:.0f}s", bar, done, total, eta_s);
}

/// The layout a checkpoint was written with (sizes and the writing rank's coordinates; pp, pp_layers and
/// pp_virtual_stages: checkpoint.h's PipelineLayout). dp and cp may change on resume (their ranks hold identical
/// parameters), and so may pp, its layer split and V (each tensor is read from the stage shard holding it); tp and
/// ep may not.
nlohmann::json mesh_json(const Mesh& g, const TrainConfig& c) {
  nlohmann::json j = {{"tp", g.tp_size()}, {"cp", g.cp_size()}, {"ep", g.ep_size()}, {"dp", g.dp_size()},
                      {"tp_rank", g.tp_rank()}, {"cp_rank", g.cp_rank()}, {"ep_rank", g.ep_rank()}};
  if (g.pp_size() > 1) {
    j["pp"] = g.pp_size();
    j["pp_rank"] = g.pp_rank();
    j["pp_layers"] =
        pipeline_virtual_stage_layers(static_cast<int>(c.model.num_layers), g.pp_size(), c.pipeline_split);
    j["pp_virtual_stages"] = c.pipeline_split.virtual_stages;
  }
  return j;
}

/// Named tensors of a checkpoint shard: every parameter, then Adam's first and second moments (`m`, `v`, full
/// tensors index-aligned with the parameters).
std::vector<std::pair<std::string, Tensor*>> checkpoint_tensors(Decoder& model, std::vector<Tensor>& m,
                                                                 std::vector<Tensor>& v) {
  std::vector<std::pair<std::string, Tensor*>> t;
  ParamList ps = model.params();
  for (size_t i = 0; i < ps.size(); ++i) t.emplace_back(ps[i]->name, &ps[i]->value);
  for (size_t i = 0; i < ps.size(); ++i) t.emplace_back(ps[i]->name + ".exp_avg", &m[i]);
  for (size_t i = 0; i < ps.size(); ++i) t.emplace_back(ps[i]->name + ".exp_avg_sq", &v[i]);
  return t;
}

/// Whether this rank writes its state to a checkpoint, and the last field of its shard's name. Data-parallel
/// replicas hold identical state, so only dp rank 0 writes, as dp_000 (Megatron does the same). With expert
/// parallelism the ep ranks hold different experts: the ranks of expert-dp rank 0 (one per ep rank) write, the
/// ep rank in that field (Megatron names expert shards by their ep rank too). Pipeline stages hold different
/// layers: each stage's dp rank 0 writes, the stage in that field (stage × ep + ep rank with both).
bool checkpoint_writer(const Mesh& g) { return g.ep_size() > 1 ? g.expert_dp_rank() == 0 : g.dp_rank() == 0; }
int checkpoint_shard_field(const Mesh& g) { return checkpoint_stage_field(g.pp_rank(), g.ep_size(), g.ep_rank()); }

/// --load: the layout fields of the checkpoint's meta (`meta`, of the shard of tp rank r, field 0). ep must equal
/// this run's (kInvalidArgument naming the flag); the pipeline layout may differ (load_pipeline_shards) and is
/// returned.
PipelineLayout check_saved_layout(const TrainConfig& cfg, const Mesh& g, const std::string& meta) {
  const auto j = nlohmann::json::parse(meta, nullptr, false);
  const nlohmann::json mesh = j.is_object() && j.contains("mesh") ? j["mesh"] : nlohmann::json::object();
  const int ep = mesh.value("ep", 1);
  if (ep != g.ep_size())
    throw_invalid("--load {}: the checkpoint was saved with --expert-model-parallel-size {} but this run has {}; "
                  "resume with the same expert-parallel size",
                  cfg.load, ep, g.ep_size());
  return checkpoint_pipeline_layout(meta, cfg.model.num_layers);
}

/// Loads `s.tensors` from the shards of another pipeline layout `saved`: each from the stage shard holding it
/// (checkpoint_stage_of; parameter names are global, so a layer's tensors are the same wherever it lives), of this
/// rank's ep rank `ep_rank` of `ep_size` (its experts; ep is the checkpoint's). Sets s.meta_json from the last
/// shard read. load_shard's errors, per rank.
void load_pipeline_shards(const std::string& dir, int64_t iteration, const PipelineLayout& saved, int ep_size,
                          int ep_rank, CheckpointShard& s) {
  std::map<int, CheckpointShard> by_stage;
  for (const auto& t : s.tensors) {
    const int stage = checkpoint_stage_of(t.first, saved);
    auto [it, fresh] = by_stage.try_emplace(stage);
    CheckpointShard& part = it->second;
    if (fresh) {
      part.config_hash = s.config_hash;
      part.tp_rank = s.tp_rank;
      part.tp_size = s.tp_size;
      part.dp_rank = checkpoint_stage_field(stage, ep_size, ep_rank);
      part.meta_json = s.meta_json;
      part.partial = true;
    }
    part.tensors.push_back(t);
  }
  for (auto& [stage, part] : by_stage) {
    load_shard(dir, iteration, part);
    s.meta_json = part.meta_json;
  }
}

/// A checkpoint holds the full (tp-shard) parameters and moments whatever the sharding strategy, so that it loads
/// with any strategy and any dp size (Megatron's fully reshardable format): a sharded run gathers them first
/// (collective over the replica groups), and the writers above write them as no_shard does.
void save_checkpoint(const TrainConfig& cfg, Mesh& g, Decoder& model, AdamW& opt, FullyShardedDataParallel* fsdp,
                     const LossScaler* scaler, int64_t iteration) {
  std::vector<Tensor> full_m, full_v;
  if (fsdp) fsdp->gather_full_state(opt.exp_avg(), opt.exp_avg_sq(), full_m, full_v);
  if (checkpoint_writer(g)) {
    CheckpointShard s;
    s.iteration = iteration;
    s.config_hash = cfg.model.hash();
    s.tp_rank = g.tp_rank();
    s.tp_size = g.tp_size();
    s.dp_rank = checkpoint_shard_field(g);
    nlohmann::json meta{{"iteration", iteration},
                        {"adam_step", opt.step_count()},
                        {"seed", cfg.seed},
                        {"model", cfg.model.shape_flags()},
                        {"model_config", nlohmann::json::parse(model_config_json(cfg.model))},
                        {"mesh", mesh_json(g, cfg)},
                        {"data_parallel_sharding_strategy", fsdp ? to_string(fsdp->options().strategy) : "no_shard"}};
    if (scaler) {  // Megatron keeps its grad scaler's state with the optimizer's
      const LossScaler::State ls = scaler->state();
      meta["loss_scaler"] = {{"scale", ls.scale}, {"good_steps", ls.good_steps},
                             {"hysteresis_left", ls.hysteresis_left}, {"skipped", ls.skipped}};
    }
    s.meta_json = meta.dump();
    s.tensors = fsdp ? checkpoint_tensors(model, full_m, full_v) : checkpoint_tensors(model, opt.exp_avg(),
                                                                                      opt.exp_avg_sq());
    save_shard(cfg.save, s);
  }
  if (fsdp) fsdp->release_full();
  // Every shard must be complete before `latest` points at the iteration.
  g.world->barrier("checkpoint save");
  if (g.world->rank() == 0) write_latest(cfg.save, iteration);
  g.world->barrier("checkpoint latest");
  if (g.world->rank() == 0) log::info("saved checkpoint at iteration {} to {}", iteration, cfg.save);
}

/// Fails at start-up, not after hours of training, when --save cannot be written.
void check_save_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw_invalid("--save {}: cannot create the directory ({}); pass a writable directory", dir,
                  ec ? ec.message() : "a file of that name exists");
  const std::string probe = fmt::format("{}/.coc-write-test.{}", dir, log::rank());
  std::FILE* f = std::fopen(probe.c_str(), "w");
  if (!f) throw_invalid("--save {}: the directory is not writable; pass a writable directory", dir);
  std::fclose(f);
  std::remove(probe.c_str());
}

/// Each rank reads its own checkpoint files, but a wrong --load or model flag fails the same way on every rank:
/// agree on the outcome (collective over `world`) so that such an error is reported once (a uniform error), not
/// once per rank through MPI_Abort. A failure on some ranks only stays rank-local: those ranks abort the job with
/// their message, and the others wait for that instead of printing a second error.
void agree_on_load(Communicator& world, const std::optional<Error>& failed) {
  float n_failed = failed ? 1.0f : 0.0f;
  world.all_reduce(&n_failed, 1, ReduceOp::kSum, "checkpoint load outcome", /*blocking=*/true).wait();
  if (n_failed == 0) return;
  const float kind = failed ? static_cast<float>(failed->kind()) : -1.0f;
  float kinds[2] = {kind, -kind};  // max and -min of the error kinds
  world.all_reduce(kinds, 2, ReduceOp::kMax, "checkpoint load error kinds", /*blocking=*/true).wait();
  if (failed) {
    const bool same_everywhere = n_failed == static_cast<float>(world.size()) && kinds[0] == -kinds[1];
    throw Error(failed->kind(), failed->what(), same_everywhere);
  }
  world.barrier("checkpoint load: waiting for the failing rank to abort the job");
}

int64_t load_checkpoint(const TrainConfig& cfg, Mesh& g, Decoder& model, AdamW& opt, FullyShardedDataParallel* fsdp,
                        LossScaler* scaler) {
  std::error_code ec;
  if (!std::filesystem::is_directory(cfg.load, ec))
    throw_invalid("--load {}: {}; pass the --save directory of an earlier run", cfg.load,
                  std::filesystem::exists(cfg.load, ec) ? "not a directory" : "no such directory");
  std::optional<Error> failed;
  std::optional<int64_t> latest;
  try {
    latest = read_latest(cfg.load);
  } catch (const Error& e) {
    failed = e;
  }
  agree_on_load(*g.world, failed);
  if (!latest && cfg.exit_on_missing_checkpoint)
    throw_invalid("--load {}: no latest_checkpointed_iteration.txt, and --exit-on-missing-checkpoint is given; pass "
                  "the --save folder of an earlier run",
                  cfg.load);
  if (!latest) {
    if (g.world->rank() == 0)
      log::warn("--load {}: no latest_checkpointed_iteration.txt; starting from scratch", cfg.load);
    return 0;
  }
  const int64_t iteration = *latest;
  // Shards of another ep size hold other experts, and their files have other names: name the ep before the tensors'
  // shapes or a missing file would (dp_000 exists for any ep and pp; tp is checked with the shard itself). Another
  // pipeline layout is read stage shard by stage shard.
  const PipelineLayout here{g.pp_size(), pipeline_virtual_stage_layers(static_cast<int>(cfg.model.num_layers),
                                                                       g.pp_size(), cfg.pipeline_split)};
  PipelineLayout saved = here;
  try {
    const std::string first = checkpoint_shard_path(cfg.load, iteration, g.tp_rank(), 0);
    if (std::filesystem::exists(first)) {
      SafetensorsHeader h;
      try {
        h = read_safetensors_header(first);
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kCorrupt) throw;
        std::string why = e.what();  // "<path> is not a valid safetensors file (...); pass a complete ..."
        why = why.substr(0, why.rfind("; pass a complete"));
        throw_error(ErrorKind::kCorrupt, "checkpoint {} {}; {}", first, why.substr(why.find(" is not") + 1),
                    checkpoint_recovery_hint(cfg.load, iteration));
      }
      const auto it = h.metadata.find("meta");
      saved = check_saved_layout(cfg, g, it == h.metadata.end() ? "{}" : it->second);
    }
  } catch (const Error& e) {
    failed = e;
  }
  agree_on_load(*g.world, failed);
  CheckpointShard s;
  s.config_hash = cfg.model.hash();
  s.tp_rank = g.tp_rank();
  s.tp_size = g.tp_size();
  s.dp_rank = checkpoint_shard_field(g);
  // A sharded run reads the full tensors, then keeps its shards (checkpoints are strategy-independent).
  // --no-load-optim and --finetune read the moments into scratch tensors and drop them.
  const bool load_optim = cfg.load_optim && !cfg.finetune;
  std::vector<Tensor> full_m, full_v;
  if (fsdp) fsdp->allocate_full();
  if (fsdp || !load_optim) {
    for (Param* p : model.params()) {
      full_m.emplace_back(p->value.shape());
      full_v.emplace_back(p->value.shape());
    }
  }
  s.tensors = fsdp || !load_optim ? checkpoint_tensors(model, full_m, full_v)
                                  : checkpoint_tensors(model, opt.exp_avg(), opt.exp_avg_sq());
  s.meta_json = nlohmann::json{{"model", cfg.model.shape_flags()}}.dump();  // quoted if the configs differ
  try {
    if (saved == here)
      load_shard(cfg.load, iteration, s);
    else
      load_pipeline_shards(cfg.load, iteration, saved, g.ep_size(), g.ep_rank(), s);
  } catch (const Error& e) {
    failed = e;
  }
  agree_on_load(*g.world, failed);
  auto meta = nlohmann::json::parse(s.meta_json, nullptr, false);
  if (meta.is_discarded() || !meta.contains("adam_step"))
    throw_error(ErrorKind::kCorrupt, "rank {}: checkpoint {} has no optimizer step in its metadata; it was not written "
                "by coc train", log::rank(), checkpoint_shard_path(cfg.load, iteration, g.tp_rank(), 0));
  std::vector<Tensor> m = opt.exp_avg(), v = opt.exp_avg_sq();
  // The shards take the loaded weights also without the moments (those then land in m and v, which are dropped).
  if (fsdp) fsdp->scatter_full_state(full_m, full_v, m, v);
  if (fsdp) fsdp->release_full();
  if (load_optim) opt.load_state(std::move(m), std::move(v), meta["adam_step"].get<int64_t>());
  // An --fp16 run resumes its scale; a checkpoint of a bf16 or fp32 run (no scaler state) starts a fresh one.
  if (load_optim && scaler && meta.contains("loss_scaler")) {
    const nlohmann::json& ls = meta["loss_scaler"];
    scaler->load_state({ls.value("scale", 0.0), ls.value("good_steps", int64_t{-1}),
                        ls.value("hysteresis_left", int64_t{-1}), ls.value("skipped", int64_t{-1})});
  }
  if (g.world->rank() == 0)
    log::info("{} {} at iteration {}{}", cfg.finetune ? "fine-tuning the weights of" : "resumed from", cfg.load,
              iteration,
              cfg.finetune ? " from iteration 0, with a fresh optimizer (--finetune)"
                           : load_optim ? "" : ", with a fresh optimizer and learning-rate schedule (--no-load-optim)");
  return cfg.finetune ? 0 : iteration;
}

/// The full-vocabulary logits [V] of the last of `len` tokens (Decoder::next_token_logits, or through the pipeline
/// stages: PipelineSchedule::next_token_logits). Collective over tp (and pp).
using LogitsOf = std::function<std::vector<float>(const int32_t* tokens, int64_t len)>;

std::string generate(const LogitsOf& logits_of, const TrainConfig& cfg, const Tokenizer& tokenizer) {
  std::vector<int32_t> ctx = tokenizer.encode(cfg.sample_prompt);
  if (ctx.empty()) ctx = tokenizer.encode("\n");
  std::vector<int32_t> generated;
  // Same seed on every rank and bitwise-identical gathered logits, so every rank samples the same bytes.
  std::mt19937_64 rng(cfg.seed ^ 0x5eedull);
  for (int64_t i = 0; i < cfg.sample_length; ++i) {
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(ctx.size()), cfg.model.seq_length);
    std::vector<float> logits = logits_of(ctx.data() + ctx.size() - len, len);
    float mx = -INFINITY;
    for (float l : logits) mx = std::max(mx, l);
    std::vector<double> p(logits.size());
    for (size_t j = 0; j < p.size(); ++j) p[j] = std::exp((logits[j] - mx) / cfg.sample_temperature);
    std::discrete_distribution<int> pick(p.begin(), p.end());
    int tok = pick(rng);
    ctx.push_back(tok);
    generated.push_back(tok);
  }
  return cfg.sample_prompt + tokenizer.decode(generated);
}

/// --logits-out: the full-vocabulary logits after each token of the prompt, fp32 [len, vocab] row-major, written by
/// rank 0 (collective over TP: every rank runs the forwards).
void write_logits(const LogitsOf& logits_of, const TrainConfig& cfg, const Tokenizer& tokenizer, int world_rank) {
  const std::vector<int32_t> ids = tokenizer.encode(cfg.sample_prompt);
  if (ids.empty()) throw_invalid("--logits-out needs a non-empty --sample-prompt");
  if (static_cast<int64_t>(ids.size()) > cfg.model.seq_length)
    throw_invalid("--sample-prompt has {} tokens, more than --seq-length {}", ids.size(), cfg.model.seq_length);
  std::vector<float> all;
  for (size_t len = 1; len <= ids.size(); ++len) {
    std::vector<float> l = logits_of(ids.data(), static_cast<int64_t>(len));
    all.insert(all.end(), l.begin(), l.end());
  }
  if (world_rank != 0) return;
  std::FILE* f = std::fopen(cfg.logits_out.c_str(), "wb");
  const bool ok = f && std::fwrite(all.data(), sizeof(float), all.size(), f) == all.size();
  if (f) std::fclose(f);
  if (!ok) throw_error(ErrorKind::kIo, "--logits-out {}: cannot write the file", cfg.logits_out);
}

/// --bf16 needs oneDNN's bf16 matmul: refused where there is none, warned about where it is emulated or where the
/// CPU's AMX goes unused.
void check_bf16_gemms() {
  const OneDnnInfo info = onednn_info();
  if (info.bf16_kernel.empty())
    throw_invalid("rank {}: --bf16: oneDNN {} has no bf16 matmul on this CPU (ISA {}): it needs AVX-512 at least; "
                  "drop --bf16 to train in fp32",
                  log::rank(), info.version, info.isa);
  if (!info.bf16_native && log::rank() == 0)
    log::warn("--bf16: this CPU has no bf16 dot products (ISA {}); oneDNN emulates them ({}), so the GEMMs run "
              "slower than in fp32 while rounding like bf16. Drop --bf16 here; it pays on CPUs with AVX512_BF16 or "
              "AMX (Zen 4 and later, Cooper Lake, Sapphire Rapids and later)",
              info.isa, info.bf16_kernel);
  if (info.amx_unused && log::rank() == 0)
    log::warn("--bf16: this CPU has AMX-BF16, but oneDNN runs bf16 GEMMs on {} (ISA {}), which made bf16 training "
              "slower than fp32 on Emerald Rapids (docs/performance.md point 43). Unset ONEDNN_MAX_CPU_ISA if it "
              "is set; AMX needs Linux 5.16 or later",
              info.bf16_kernel, info.isa);
}

/// FSDP's and ZeRO's parameter gathers (FsdpOptions::param_gather_dtype): bf16 under --bf16, implied by it as in
/// Megatron, whose bf16 model parameters are what its distributed optimizer gathers. Only the parameters that
/// bf16 GEMMs read are gathered so (Param::read_as_compute_type), which keeps the bits. --fp16 gathers fp32 (its
/// messages stay fp32: docs/mixed-precision.md).
DType param_gather_dtype(const TrainConfig& c) {
  return c.compute_type() == DType::kBF16 ? DType::kBF16 : DType::kF32;
}

/// The element type of the pipeline's stage transfers A(i): a stage's output is the residual stream, which holds
/// 16-bit values under --bf16/--fp16 unless --fp32-residual-connection, so it travels in 2 bytes then, with the same
/// bits.
DType pipeline_wire_type(const TrainConfig& c) {
  return c.compute_type() != DType::kF32 && !c.model.fp32_residual_connection ? c.compute_type() : DType::kF32;
}

/// One run's state, built once by its constructor: the mesh, the data, the model, its optimizer, and the counters
/// of the CoC ops. The layers hold pointers into `side_ctx` and `stats`, so a Run never moves.
struct Run {
  const TrainConfig& cfg;
  /// The fp32 GEMM library of this run (--gemm-backend over the process's); a --baseline side may name another.
  GemmBackend gemm_backend = cfg.gemm_backend.value_or(coc::gemm_backend());
  Mesh mesh;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<TrainingData> data;
  CocStats stats;
  std::unique_ptr<Communicator> cp_overlap_comm;  ///< --use-cp-send-recv-overlap's second cp communicator
  /// The layers' context of each side of `coc bench train --baseline` (choose_schedule points the decoder at one):
  /// [0] the baseline's switchable settings, [1] this config's (the only one without --baseline). Built here, never
  /// written afterwards.
  std::array<ParallelContext, 2> side_ctx;
  std::array<std::optional<CpRing>, 2> side_ring;
  RingAttentionOptions ring_opts;
  std::unique_ptr<Decoder> model;
  ParamList params;
  /// The data-parallel gradient reduction (all-reduce, overlapped all-reduce or ZeRO-1/2/3), hooked into the
  /// decoder's modules; owns the shards AdamW steps when sharded.
  std::unique_ptr<GradientSync> grad_sync;
  std::unique_ptr<AdamW> opt;
  std::optional<LossScaler> scaler;  ///< --fp16
  int64_t micro_batches = 1;  ///< per dp rank and iteration
  /// --overlap-forward-micro-batches on this iteration's side (choose_schedule), and the second micro-batch's ids.
  bool pair_forwards = cfg.overlap_forward_micro_batches;
  std::vector<int32_t> tokens_b, targets_b;
  /// --pipeline-model-parallel-size > 1: the 1F1B schedule over this rank's stage; null otherwise.
  std::unique_ptr<PipelineSchedule> pipeline;

  /// Collective over the world. Ranks launched with different flags fail here, with one error, before any work.
  Run(const TrainConfig& c, const CommOptions& copts)
      : cfg(c),
        mesh(make_mesh({.tp = c.tensor_model_parallel_size, .cp = c.context_parallel_size,
                        .ep = c.expert_model_parallel_size, .pp = c.pipeline_model_parallel_size},
                       copts)) {
    check_same_config(*mesh.world, c);
    set_gemm_backend(gemm_backend);
    if (c.bf16 || (c.baseline && c.baseline->bf16)) check_bf16_gemms();
    set_gemm_compute_type(c.compute_type());
    if (c.fp16) scaler.emplace(c.loss_scale);
    // Before anything is timed, and on every rank (a corrupt file is refused by all of them alike).
    set_tuning_cache(c.coc_tuning_cache.empty() ? nullptr : TuningCache::open(*mesh.world, c.coc_tuning_cache));
    // The tp link's fingerprint, which every lookup keys on, reads Open MPI's control variables through MPI_T, whose
    // start loads every component's parameters (~0.2 s on the shaped cluster): here, not inside the first step.
    if (tuning_cache() && mesh.tp->size() > 1) link_fingerprint(*mesh.tp);
    tokenizer = make_tokenizer(c.tokenizer_type, c.tokenizer_model);
    data = std::make_unique<TrainingData>(c.data_path, c.split, *tokenizer, c.model.seq_length);
    if (c.eval_iters > 0 && !data->has(Split::kValid))
      throw_invalid("--eval-iters {} needs validation data of at least {} tokens per source, but the validation part "
                    "of --data-path holds {}; pass --split with a validation share, e.g. --split 98,2,0",
                    c.eval_iters, c.model.seq_length + 1, data->tokens(Split::kValid));
    const ParallelContext run_ctx = make_parallel_context(*mesh.tp, c.overlap(), &stats);
    side_ctx = {c.baseline ? make_parallel_context(*mesh.tp, baseline_overlap(c), &stats) : run_ctx, run_ctx};
    MoeConfig moe = c.moe;
    moe.deterministic = c.deterministic;
    model = std::make_unique<Decoder>(local_model(c), mesh.model_groups(), &side_ctx[1], c.seed, moe,
                                      c.pipeline_split);
    model->set_recompute(c.recompute);
    if (uses_ring_attention(c)) {
      ring_opts.mask = c.attention_mask;
      ring_opts.window_size = c.cp_window_size;
      // Either side may use the second communicator, so it is made when either asks for it.
      const bool base_overlap = c.baseline && c.baseline->cp_send_recv_overlap;
      const CpRing duplex = make_cp_ring(*mesh.cp, c.cp_send_recv_overlap || base_overlap, cp_overlap_comm);
      const CpRing single{duplex.cp, nullptr};
      side_ring = {base_overlap ? duplex : single, c.cp_send_recv_overlap ? duplex : single};
      model->set_context_parallel(*side_ring[1], ring_opts);
    }
    params = model->params();
    std::vector<ParamList> modules;
    for (int i = 0; i < model->num_modules(); ++i) modules.push_back(model->module_params(i));
    GradSyncOptions so;
    so.sharding = {.strategy = c.data_parallel_sharding_strategy,
                   .forward_prefetch = c.num_to_forward_prefetch,
                   .backward_prefetch = c.num_to_backward_prefetch,
                   .deterministic = c.deterministic,
                   .grad_reduce_dtype = c.grad_reduce_in_bf16 ? DType::kBF16 : DType::kF32,
                   .param_gather_dtype = param_gather_dtype(c),
                   .random_delay_seed = static_cast<uint64_t>(env::get_int(env::Var::kTestFsdpDelaySeed))};
    so.overlap_grad_reduce = c.overlap_grad_reduce;
    so.overlap_grad_reduce_switchable = c.baseline && c.baseline->overlap_grad_reduce;
    grad_sync = make_gradient_sync(mesh, std::move(modules), so, [this](HookPoint point, ModuleHook hook) {
      model->add_hook(point, std::move(hook));
    });
    opt = std::make_unique<AdamW>(grad_sync->optimizer_params(), c.optim);
    micro_batches = c.global_batch_size / (c.micro_batch_size * mesh.dp_size());
    if (mesh.pp_size() > 1) {
      // The interleaved schedule's M % P rule, refused here rather than in the first step.
      interleaved_order(mesh.pp_size(), 0, static_cast<int>(micro_batches), c.pipeline_split.virtual_stages);
      pipeline = std::make_unique<PipelineSchedule>(*model, *mesh.pp, pipeline_wire_type(c),
                                                    c.overlap_p2p_communication);
    }
    if (pairs_forwards(c)) model->set_pipeline_slots(0, 2);  // forward_pair's second micro-batch
    model->reserve_activations(c.micro_batch_size);  // their page faults belong to start-up, not to step 1
  }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
};

/// `coc bench train --baseline` (TrainConfig::baseline): the even iterations run the baseline's switchable
/// settings, the odd ones the run's. Returns true for a baseline iteration. Every rank calls it at the top of
/// iteration `it` and decides from `it` alone, so under pipeline parallelism every rank of every stage switches at
/// the same iteration boundary, when the previous iteration (or evaluation) has delivered every stage transfer.
bool choose_schedule(Run& r, int64_t it) {
  if (!r.cfg.baseline) return false;
  const bool baseline = it % 2 == 0;
  const int side = baseline ? 0 : 1;
  r.model->set_parallel_context(&r.side_ctx[side]);
  if (r.side_ring[side]) r.model->set_context_parallel(*r.side_ring[side], r.ring_opts);
  const TrainConfig& c = baseline ? *r.cfg.baseline : r.cfg;
  set_gemm_backend(c.gemm_backend.value_or(r.gemm_backend));
  set_gemm_compute_type(c.compute_type());
  r.grad_sync->set_switches(c.num_to_forward_prefetch, c.num_to_backward_prefetch, c.overlap_grad_reduce,
                            param_gather_dtype(c));
  if (r.cfg.model.is_moe()) r.model->set_moe_dispatcher(c.moe.dispatcher, c.moe.mc2_chunks);
  r.model->set_recompute(c.recompute);
  r.pair_forwards = c.overlap_forward_micro_batches;
  if (r.pipeline) r.pipeline->set_switches(pipeline_wire_type(c), c.overlap_p2p_communication);
  return baseline;
}

void zero_grad(const ParamList& params) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "zero_grad");
  for (Param* p : params) p->grad.zero();
}

/// Context parallelism: keeps, of a micro-batch's token ids [S, B] (sequence-major), this cp rank's zig-zag
/// positions [S / CP, B] (parallel/ring_attention.h): each cp rank of a dp replica reads the same sequences.
void keep_zigzag_positions(const Mesh& mesh, std::vector<int32_t>& ids, int64_t batch) {
  const int P = mesh.cp_size(), r = mesh.cp_rank();
  const int64_t S = static_cast<int64_t>(ids.size()) / batch, L = S / P;
  std::vector<int32_t> local(static_cast<size_t>(L * batch));
  for (int64_t t = 0; t < L; ++t) {
    const int64_t g = zigzag_position(t, r, P, S);
    std::copy(ids.begin() + g * batch, ids.begin() + (g + 1) * batch, local.begin() + t * batch);
  }
  ids.swap(local);
}

/// Loads micro-batch `mb` of iteration `it` of `split` into tokens and targets: this dp rank's sequences, and under
/// context parallelism this cp rank's zig-zag positions of them (what the decoder's layers read).
void load_micro_batch(Run& r, Split split, int64_t it, int64_t mb, std::vector<int32_t>& tokens,
                      std::vector<int32_t>& targets) {
  const TrainConfig& cfg = r.cfg;
  r.data->sample_batch(split, it, static_cast<int>(mb), r.mesh.dp_rank(), r.mesh.dp_size(),
                       static_cast<int>(cfg.micro_batch_size), static_cast<int>(cfg.model.seq_length), cfg.seed,
                       tokens, targets);
  if (r.mesh.cp_size() > 1) {
    keep_zigzag_positions(r.mesh, tokens, cfg.micro_batch_size);
    keep_zigzag_positions(r.mesh, targets, cfg.micro_batch_size);
  }
}

/// The weights that bf16 GEMMs read, for GemmWeightCopies over one iteration's forwards and backwards (they change
/// only at the optimizer step). None under optim_grads_params, whose weights are freed and gathered again inside
/// the iteration, where a freed buffer's address may come back as an activation's.
std::vector<std::span<const float>> gemm_weights(const Run& r) {
  std::vector<std::span<const float>> w;
  if (r.cfg.data_parallel_sharding_strategy == ShardingStrategy::kOptimGradsParams) return w;
  for (const Param* p : r.params)
    if (p->read_as_compute_type) w.emplace_back(p->value.data(), static_cast<size_t>(p->value.numel()));
  return w;
}

/// forward_backward under pipeline parallelism: the 1F1B schedule over this rank's stage. Returns the mean loss over
/// the micro-batches on the last stage (added in micro-batch order, as at P = 1), 0 on the others; `aux_loss`: this
/// stage's MoE load-balancing loss as forward_backward's (its layers only; finish_iteration adds the stages').
double pipeline_forward_backward(Run& r, int64_t it, double& aux_loss) {
  const double scale = r.scaler ? r.scaler->scale() : 1.0;
  PipelineCallbacks cb;
  cb.load = [&](int mb, std::vector<int32_t>& tokens, std::vector<int32_t>& targets) {
    load_micro_batch(r, Split::kTrain, it, mb, tokens, targets);
  };
  // The data-parallel sync learns before each backward whether it is the iteration's last (--overlap-grad-reduce
  // posts from that one's hooks); under 1F1B forwards run ahead of backwards, so it is told there.
  cb.before_backward = [&](int mb) { r.grad_sync->begin_micro_batch(mb == r.micro_batches - 1); };
  cb.after_forward = [&](int, int c) {
    aux_loss += r.model->moe_aux_loss(c) / static_cast<double>(r.micro_batches);
  };
  const double sum = r.pipeline->train_step(static_cast<int>(r.micro_batches), r.cfg.micro_batch_size,
                                            static_cast<float>(scale / static_cast<double>(r.micro_batches)), cb);
  return sum / static_cast<double>(r.micro_batches);
}

/// --overlap-forward-micro-batches: micro-batches mb and mb + 1 of iteration `it`, their forwards interleaved
/// (Decoder::forward_pair), then each one's head and backward in micro-batch order, so that the gradients are
/// summed as the sequential loop sums them. Returns the sum of their language-model losses (nats).
double paired_forward_backward(Run& r, int64_t it, int64_t mb, std::vector<int32_t>& tokens,
                               std::vector<int32_t>& targets, float scale) {
  {
    COC_TRACE_SCOPE(trace::Cat::kHostWork, trace::Level::kLevel0, "data", {"micro_batch", mb});
    load_micro_batch(r, Split::kTrain, it, mb, tokens, targets);
    load_micro_batch(r, Split::kTrain, it, mb + 1, r.tokens_b, r.targets_b);
  }
  {
    COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "forward", {"micro_batch", mb}, {"micro_batches", 2});
    r.model->forward_pair(tokens.data(), targets.data(), r.tokens_b.data(), r.targets_b.data(),
                          r.cfg.micro_batch_size);
  }
  double loss = 0;
  for (int k = 0; k < 2; ++k) {
    r.grad_sync->begin_micro_batch(mb + k == r.micro_batches - 1);
    {
      COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "forward", {"micro_batch", mb + k}, {"head", 1});
      loss += r.model->forward_head(k);
    }
    COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "backward", {"micro_batch", mb + k});
    r.model->backward_stage(0, k, {}, scale, {});
  }
  return loss;
}

/// Forward and backward of this rank's micro-batches of iteration `it`, accumulating the gradients (each micro-batch
/// scaled by 1/micro_batches). Returns the mean language-model loss over the micro-batches (nats); `aux_loss`: the
/// mean over the micro-batches of the MoE layers' load-balancing loss, summed over the layers (0 when dense).
double forward_backward(Run& r, int64_t it, std::vector<int32_t>& tokens, std::vector<int32_t>& targets,
                        double& aux_loss) {
  const TrainConfig& cfg = r.cfg;
  const GemmWeightCopies weight_copies(gemm_weights(r));
  double loss_sum = 0;
  aux_loss = 0;
  if (r.pipeline) return pipeline_forward_backward(r, it, aux_loss);
  const double scale = r.scaler ? r.scaler->scale() : 1.0;
  const auto mb_scale = static_cast<float>(scale / static_cast<double>(r.micro_batches));
  for (int64_t mb = 0; mb < r.micro_batches; ++mb) {
    if (r.pair_forwards && mb + 1 < r.micro_batches) {
      loss_sum += paired_forward_backward(r, it, mb++, tokens, targets, mb_scale);
      continue;
    }
    {
      COC_TRACE_SCOPE(trace::Cat::kHostWork, trace::Level::kLevel0, "data", {"micro_batch", mb});
      load_micro_batch(r, Split::kTrain, it, mb, tokens, targets);
    }
    r.grad_sync->begin_micro_batch(mb == r.micro_batches - 1);
    {
      COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "forward", {"micro_batch", mb});
      loss_sum += r.model->forward(tokens.data(), targets.data(), cfg.micro_batch_size);
      aux_loss += r.model->moe_aux_loss() / static_cast<double>(r.micro_batches);
    }
    COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "backward", {"micro_batch", mb});
    r.model->backward(mb_scale);
  }
  return loss_sum / static_cast<double>(r.micro_batches);
}

/// The gradient norm (before clipping), then clipping and the AdamW step at the learning rate of iteration `it`.
/// Throws a uniform kInvalidArgument error when the norm is not finite (the run diverged). Returns the norm.
/// Under --fp16 the gradients hold the loss scale: the norm and the step divide it out, and a step whose norm is inf
/// or NaN (an fp16 value overflowed) is skipped, the scaler told, and NaN returned.
double update(Run& r, int64_t it, float lr) {
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "optimizer");
  const double scale = r.scaler ? r.scaler->scale() : 1.0;
  const double norm = r.grad_sync->grad_norm() / scale;
  if (r.scaler) r.scaler->update(!std::isfinite(norm));
  if (!std::isfinite(norm)) {
    if (r.scaler) {
      r.grad_sync->after_step();
      return std::nan("");
    }
    throw_invalid("the gradient norm became {} at iteration {}: training diverged; lower --lr (now {}), raise "
                  "--lr-warmup-iters or keep --clip-grad on",
                  norm, it + 1, r.cfg.optim.lr);
  }
  r.opt->step(lr, static_cast<float>(clip_scale(norm, r.cfg.optim.clip_grad) / scale));
  r.grad_sync->after_step();
  return norm;
}

/// The iteration's record: the loss averaged over dp, the slowest rank's time (collective over dp and the world);
/// `reduce_ms` is this rank's time in sync_gradients (and in the waits of sharded data parallelism).
IterationLog finish_iteration(Run& r, int64_t it, double loss, double aux_loss, double norm, float lr,
                              Clock::time_point t0, bool baseline, double reduce_ms) {
  float red[1] = {static_cast<float>(loss)};
  // Each cp rank's loss is the mean over its S / CP positions of the same sequences (equal counts), so the mean
  // over dp × cp is the mean over every token of the global batch.
  Communicator& loss_group = r.mesh.cp_size() > 1 ? *r.mesh.dp_cp : *r.mesh.dp;
  loss_group.all_reduce(red, 1, ReduceOp::kSum, "loss").wait();
  // Pipeline: the last stage has the loss; every rank logs it.
  if (r.mesh.pp_size() > 1) r.mesh.pp->broadcast(red, 1, r.mesh.pp_size() - 1, "loss (pipeline)").wait();
  float elapsed = static_cast<float>(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  r.mesh.world->all_reduce(&elapsed, 1, ReduceOp::kMax, "iteration time").wait();
  IterationLog rec;
  rec.iteration = it + 1;
  rec.loss = red[0] / static_cast<double>(loss_group.size());
  // The aux loss is global over the token group already: the same on every rank.
  double moe[2] = {aux_loss, static_cast<double>(r.model->moe_layers())};
  // Pipeline: each stage has its layers' part; every rank logs the whole model's.
  if (r.mesh.pp_size() > 1 && r.cfg.model.is_moe())
    r.mesh.pp->all_reduce_values(std::span<double>(moe), ReduceOp::kSum, "MoE aux loss (pipeline)");
  if (moe[1] > 0) rec.load_balancing_loss = moe[0] / moe[1];
  rec.lr = lr;
  rec.grad_norm = norm;
  rec.elapsed_ms = elapsed;
  rec.tokens_per_s = r.cfg.global_batch_size * r.cfg.model.seq_length / (elapsed / 1000.0);
  rec.tflops_per_rank = r.cfg.model.num_floating_point_operations(r.cfg.global_batch_size) /
                        (elapsed / 1000.0 * 1e12 * r.mesh.world->size());
  rec.gemm_ms = r.stats.gemm_s * 1000;
  rec.comm_wait_ms = r.stats.comm_wait_s * 1000;
  rec.exposed_comm_ms = rec.comm_wait_ms + reduce_ms;  // the gradient reductions are not overlapped yet
  rec.baseline = baseline;
  if (!std::isfinite(rec.loss))
    throw_invalid("loss became {} at iteration {}; lower --lr (now {}) or raise --lr-warmup-iters", rec.loss,
                  rec.iteration, r.cfg.optim.lr);
  return rec;
}

/// After the first iteration, every rank's bytes: the persistent parameters, gradients and optimizer state (AdamW's
/// m and v, plus the fp32 master shard where it is a copy), the largest transiently gathered window (ZeRO-3's
/// unsharded modules and the full gradient buffers of ZeRO-2/3) and the process's peak RSS. Printed by every rank
/// with a sharding strategy, and with -v otherwise. Under coc bench train --baseline each side's first iteration
/// prints its own line, labelled by `side` (the activations differ with recomputation; the peak RSS is the
/// process's, so the second side's includes the first's).
void log_memory(const Run& r, const std::string& side) {
  const FsdpMemory m = r.grad_sync->memory();
  constexpr double kMiB = 1024.0 * 1024.0;
  const std::string line = fmt::format("memory per rank{}: parameters {:.2f} MiB, gradients {:.2f} MiB, optimizer "
                                       "{:.2f} MiB, gathered window {:.2f} MiB, activations {:.2f} MiB, peak RSS "
                                       "{:.1f} MiB",
                                       side.empty() ? side : " (" + side + ")", m.parameters / kMiB,
                                       m.gradients / kMiB, m.optimizer / kMiB, m.window_peak / kMiB,
                                       static_cast<double>(r.model->activation_bytes()) / kMiB,
                                       static_cast<double>(resident_memory().peak_bytes) / kMiB);
  // Every run, sharded or not: comparing no_shard with ZeRO, or watching the peak while raising the prefetch depth,
  // needs both lines.
  if (!r.cfg.quiet)
    log::info("{}", line);
  else
    log::verbose("{}", line);
}

/// Megatron's log line on rank 0 every --log-interval iterations (and the last), with the progress bar under it;
/// with -v every rank's CoC counters and the loss with every digit (%.17g round-trips a double), so that runs can
/// be compared bit for bit.
void log_iteration(const Run& r, const IterationLog& rec, int64_t start_iteration, Clock::time_point run_start) {
  const TrainConfig& cfg = r.cfg;
  COC_TRACE_SCOPE(trace::Cat::kHostWork, trace::Level::kLevel0, "logging");
  log::verbose("iteration {}: GEMM {:.1f} ms, waiting for communication {:.1f} ms, {} CoC calls, {} chunks, {} "
               "serial fallbacks, loss {:.17g}",
               rec.iteration, rec.gemm_ms, rec.comm_wait_ms, r.stats.calls, r.stats.chunks, r.stats.serial_fallbacks,
               static_cast<double>(rec.loss));
  if (r.mesh.world->rank() != 0 || cfg.quiet) return;
  if (rec.iteration % cfg.log_interval != 0 && rec.iteration != cfg.train_iters) return;
  if (cfg.progress_bar) std::printf("\r\033[K");
  // MoE: Megatron's load_balancing_loss after the loss (the loss column stays the language-model loss).
  const std::string lb = cfg.model.is_moe() ? fmt::format(" | load_balancing_loss {:.6E}", rec.load_balancing_loss)
                                            : std::string();
  // --fp16: Megatron's loss scale and skipped-iteration count, after the learning rate.
  const std::string ls = cfg.fp16 ? fmt::format(" | loss scale {:.1f} | number of skipped iterations {}",
                                                rec.loss_scale, rec.skipped_iterations)
                                  : std::string();
  // Megatron's TFLOP/s per rank after the time, with three decimals: a CPU rank's figure is below Megatron's 0.1.
  std::printf(" iteration %8lld/%8lld | loss %.4f%s | lr %.3E%s | grad norm %.3f | elapsed time per iteration (ms): "
              "%.1f | throughput per GPU (TFLOP/s/GPU): %.3f | tokens/s %.0f%s\n",
              static_cast<long long>(rec.iteration), static_cast<long long>(cfg.train_iters), rec.loss, lb.c_str(),
              rec.lr, ls.c_str(), rec.grad_norm, rec.elapsed_ms, rec.tflops_per_rank, rec.tokens_per_s,
              !cfg.baseline ? "" : fmt::format(" | {}", rec.baseline ? cfg.baseline_label : cfg.run_label).c_str());
  if (cfg.progress_bar) {
    const double spent = std::chrono::duration<double>(Clock::now() - run_start).count();
    const int64_t done = rec.iteration - start_iteration;
    const double eta = done > 0 ? spent / done * (cfg.train_iters - rec.iteration) : 0.0;
    std::printf("%s", progress_bar(rec.iteration, cfg.train_iters, eta).c_str());
  }
  std::fflush(stdout);
}

/// Megatron's evaluate(): the mean loss over eval_iters global batches of `split` (validation or test), forward only,
/// with the training micro-batching; the same batches at every evaluation (eval step k draws that split's
/// "iteration" k), so evaluations are comparable. Averaged over dp (collective over dp); identical on every rank.
double evaluate(Run& r, Split split, std::vector<int32_t>& tokens, std::vector<int32_t>& targets) {
  const TrainConfig& cfg = r.cfg;
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "evaluate");
  double sum = 0;
  for (int64_t k = 0; k < cfg.eval_iters; ++k) {
    if (r.pipeline) {
      PipelineCallbacks cb;
      cb.load = [&](int mb, std::vector<int32_t>& t, std::vector<int32_t>& g) {
        load_micro_batch(r, split, k, mb, t, g);
      };
      sum += r.pipeline->forward_only(static_cast<int>(r.micro_batches), cfg.micro_batch_size, cb);
      continue;
    }
    for (int64_t mb = 0; mb < r.micro_batches; ++mb) {
      {
        COC_TRACE_SCOPE(trace::Cat::kHostWork, trace::Level::kLevel0, "data", {"micro_batch", mb});
        load_micro_batch(r, split, k, mb, tokens, targets);
      }
      sum += r.model->forward(tokens.data(), targets.data(), cfg.micro_batch_size);
    }
  }
  float red[1] = {static_cast<float>(sum / static_cast<double>(cfg.eval_iters * r.micro_batches))};
  // As the training loss (finish_iteration): the mean over dp × cp, then from the last pipeline stage.
  Communicator& loss_group = r.mesh.cp_size() > 1 ? *r.mesh.dp_cp : *r.mesh.dp;
  loss_group.all_reduce(red, 1, ReduceOp::kSum, "validation loss").wait();
  if (r.mesh.pp_size() > 1) r.mesh.pp->broadcast(red, 1, r.mesh.pp_size() - 1, "validation loss (pipeline)").wait();
  return red[0] / static_cast<double>(loss_group.size());
}

/// Megatron's evaluate_and_print_results box on rank 0: loss and perplexity. Megatron's prefix is "iteration N"
/// during training and "iteration N on validation set" / "on test set" after it; the line begins " validation loss
/// at" for both splits, as Megatron's does.
void log_evaluation(const Run& r, const EvalLog& e) {
  const std::string at = !e.at_end ? fmt::format("iteration {}", e.iteration)
                                   : fmt::format("iteration {} on {} set", e.iteration,
                                                 e.split == Split::kTest ? "test" : "validation");
  log::verbose("validation loss at {}: {:.17g}", at, e.loss);
  if (r.mesh.world->rank() != 0 || r.cfg.quiet) return;
  const std::string line =
      fmt::format(" validation loss at {} | lm loss value: {:.6E} | lm loss PPL: {:.6E} | ", at, e.loss, e.ppl());
  const std::string rule(line.size() + 1, '-');
  if (r.cfg.progress_bar) std::printf("\r\033[K");
  std::printf("%s\n%s\n%s\n", rule.c_str(), line.c_str(), rule.c_str());
  std::fflush(stdout);
}

/// One evaluation of `at.split` at `at.iteration`: evaluate(), its record in `result`, Megatron's box and
/// cfg.on_evaluation. Collective over the world (evaluate's dp reduction on every rank).
void run_evaluation(Run& r, TrainResult& result, EvalLog at, std::vector<int32_t>& tokens,
                    std::vector<int32_t>& targets) {
  at.loss = evaluate(r, at.split, tokens, targets);
  result.eval.push_back(at);
  log_evaluation(r, at);
  if (r.cfg.on_evaluation) r.cfg.on_evaluation(at);
}

/// Megatron's pretrain() after train(): the validation split, then the test split, each where it has data (do_valid,
/// do_test) and --eval-iters > 0. Megatron skips a missing test split silently; coc says so, with the reason.
void evaluate_at_end(Run& r, TrainResult& result, int64_t iteration, std::vector<int32_t>& tokens,
                     std::vector<int32_t>& targets) {
  const TrainConfig& cfg = r.cfg;
  if (cfg.eval_iters == 0) return;
  run_evaluation(r, result, {iteration, 0, Split::kValid, /*at_end=*/true}, tokens, targets);
  if (r.data->has(Split::kTest))
    run_evaluation(r, result, {iteration, 0, Split::kTest, /*at_end=*/true}, tokens, targets);
  else if (r.mesh.world->rank() == 0 && !cfg.quiet)
    log::info("note: no test split (--split {}; {} test tokens, fewer than one sequence of {} + 1): the evaluation "
              "on the test set is skipped; give the test part a share, e.g. --split 98,1,1",
              cfg.split.empty() ? std::string("not given") : cfg.split, r.data->tokens(Split::kTest),
              cfg.model.seq_length);
}

void log_start(const Run& r, const CommOptions& copts) {
  const TrainConfig& cfg = r.cfg;
  // Every rank's coordinates, once (Megatron logs its layout at initialisation).
  log::verbose("mesh: {}", r.mesh.describe());
  if (r.mesh.pp_size() > 1) {
    int64_t n = 0;
    for (const Param* p : r.params) n += p->value.numel();
    std::string layers;
    for (int ch = 0; ch < r.model->num_chunks(); ++ch)
      layers += fmt::format("{}{}-{}", ch ? "+" : "", r.model->chunk_first_layer(ch),
                            r.model->chunk_first_layer(ch) + r.model->chunk_num_layers(ch) - 1);
    log::verbose("pipeline stage {}: layers {}{}{}, {:.2f} M parameters on this rank", r.model->stage(), layers,
                 r.model->is_first_stage() ? ", embedding" : "", r.model->is_last_stage() ? ", head and loss" : "",
                 static_cast<double>(n) / 1e6);
  }
  if (r.mesh.world->rank() != 0 || cfg.quiet) return;
  // With context parallelism the layout line names cp and the ring's switches; without, it is as before.
  const std::string cp =
      r.mesh.cp_size() > 1
          ? fmt::format("cp {} (ring attention, {} mask, send/recv overlap {}, window {}) × ", r.mesh.cp_size(),
                        to_string(cfg.attention_mask), cfg.cp_send_recv_overlap ? "on" : "off", cfg.cp_window_size)
          : std::string();
  const std::string pp = r.mesh.pp_size() > 1 ? fmt::format(" × pp {}", r.mesh.pp_size()) : std::string();
  // The TP switches mean nothing at tp 1 (no TP collective to overlap): the line says so instead of listing them.
  const std::string tp_comm =
      r.mesh.tp_size() == 1
          ? std::string("no tensor-parallel communication (tp 1)")
          : fmt::format("sequence parallel {}, --coc-parallel-num {}{}", cfg.sequence_parallel ? "on" : "off",
                        cfg.coc_parallel_num == CocOptions::kAuto
                            ? std::string("auto")
                            : fmt::format("{} ({})", cfg.coc_parallel_num, to_string(cfg.coc_comm_algo)),
                        cfg.coc_fused_kernel ? ", fused kernels" : cfg.use_mc2 ? ", MC2 placement" : "");
  log::info("coc train: {} ranks = tp {} × {}dp {}{}, {}{}, engine {}", r.mesh.world->size(), r.mesh.tp_size(), cp,
            r.mesh.dp_size(), pp, tp_comm, cfg.deterministic ? " (deterministic)" : "", to_string(copts.engine));
  // Every figure of a run scales with the GEMMs' speed: say so when OpenBLAS runs them (on either side of a
  // --baseline run) with kernels below what the CPU runs. Its kernels do not matter while oneDNN runs the GEMMs.
  const bool openblas = r.gemm_backend == GemmBackend::kOpenBlas ||
                        (cfg.baseline && cfg.baseline->gemm_backend == GemmBackend::kOpenBlas);
  if (const BlasCoreAdvice a = blas_core_advice(check_blas_core()); openblas && !a.message.empty())
    log::warn("{}; fix: {}", a.message, a.fix);
  // Sharding and its prefetch act over the replicas (dp × cp; a MoE model's experts over expert-dp): say what is on,
  // and say so when there is nothing to shard, since the flags are accepted at any layout.
  const int replicas = r.mesh.dp_size() * r.mesh.cp_size();
  if (cfg.data_parallel_sharding_strategy != ShardingStrategy::kNoShard)
    log::info("sharding: {} over dp × cp = {}{}{}{}", to_string(cfg.data_parallel_sharding_strategy), replicas,
              cfg.model.is_moe() ? fmt::format(", the experts over expert-dp = {}", r.mesh.expert_dp_size())
                                 : std::string(),
              cfg.data_parallel_sharding_strategy == ShardingStrategy::kOptimGradsParams
                  ? fmt::format(", --num-to-forward-prefetch {}, --num-to-backward-prefetch {}",
                                cfg.num_to_forward_prefetch, cfg.num_to_backward_prefetch)
                  : std::string(),
              replicas == 1 ? " (one replica: nothing to shard; launch more ranks or lower "
                              "--tensor-model-parallel-size for dp > 1)"
                            : "");
  if (cfg.recompute.granularity != RecomputeGranularity::kNone) log::info("{}", describe_recompute(cfg));
  if (r.mesh.pp_size() > 1) log::info("{}", describe_pipeline(cfg, r.mesh.pp_size(), r.micro_batches));
  if (cfg.overlap_forward_micro_batches && r.mesh.tp_size() == 1)
    log::warn("--overlap-forward-micro-batches at tp 1: the forward has no tensor-parallel transfers to overlap; "
              "the flag only keeps a second micro-batch's activations (drop it, or use --tensor-model-parallel-size "
              "> 1)");
  if (cfg.fp16)
    log::info("precision: fp16 (no dot products in fp16 on x86 CPUs: the GEMMs multiply fp16 values on fp32 kernels, "
              "exact products, fp32 sums, no faster than fp32; fp32 master weights and optimizer state; loss scale {})",
              cfg.loss_scale.constant ? fmt::format("{} (constant)", *cfg.loss_scale.constant)
                                      : fmt::format("dynamic from {}, min {}, window {}, hysteresis {}",
                                                    cfg.loss_scale.initial, cfg.loss_scale.min,
                                                    cfg.loss_scale.window, cfg.loss_scale.hysteresis));
  if (cfg.bf16)
    log::info("precision: bf16 (GEMMs on oneDNN's {} with fp32 accumulation; fp32 master weights, optimizer state, "
              "gradients{}, norms' statistics, softmax, router and loss)",
              onednn_info().bf16_kernel, cfg.model.fp32_residual_connection ? " and residual stream" : "");
  if (cfg.model.is_moe())
    log::info("moe: {} experts (ffn {}) top-{} in {}, ep {} × expert-dp {}, --ep-dispatcher {}{}, "
              "capacity factor {}, aux loss coeff {}",
              cfg.model.num_experts, cfg.model.moe_ffn(), cfg.model.moe_router_topk,
              cfg.model.moe_layer_freq == 1 && cfg.model.moe_first_k_dense == 0
                  ? std::string("every layer")
                  : fmt::format("layers i with i % {} == 0{}", cfg.model.moe_layer_freq,
                                cfg.model.moe_first_k_dense > 0
                                    ? fmt::format(" and i >= {}", cfg.model.moe_first_k_dense)
                                    : std::string()),
              r.mesh.ep_size(), r.mesh.expert_dp_size(), to_string(cfg.moe.dispatcher),
              cfg.moe.dispatcher == MoeDispatcher::kMc2 ? fmt::format(" ({} chunks)", cfg.moe.mc2_chunks)
                                                        : std::string(),
              cfg.moe.capacity_factor > 0 ? fmt::format("{}", cfg.moe.capacity_factor) : std::string("none"),
              cfg.moe.aux_loss_coeff);
  log::info("model: {} layers, hidden {}, {} heads{}, ffn {}, seq {}, {:.2f} M parameters; data: {}",
            cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_attention_heads,
            cfg.model.kv_heads() != cfg.model.num_attention_heads
                ? fmt::format(" ({} query groups)", cfg.model.kv_heads())
                : std::string(),
            cfg.model.ffn_hidden_size, cfg.model.seq_length, cfg.model.num_parameters() / 1e6, r.data->description());
  if (cfg.tokenizer_type != "ByteTokenizer" || cfg.model.vocab_size != 256)
    log::info("tokenizer: {} ({}), vocabulary {} (padded to {})", cfg.tokenizer_type,
              cfg.tokenizer_model.empty() ? "bytes" : cfg.tokenizer_model, r.tokenizer->vocab_size(),
              cfg.model.vocab_size);
}

/// Sampling's logits: through the pipeline stages when there are several.
LogitsOf logits_of(Run& r) {
  if (r.pipeline) return [&r](const int32_t* t, int64_t len) { return r.pipeline->next_token_logits(t, len); };
  return [&r](const int32_t* t, int64_t len) { return r.model->next_token_logits(t, len); };
}

/// Whether --exit-duration-in-mins has passed since `start` on any rank (Megatron all-reduces the same flag, so that
/// every rank stops after the same iteration). Collective over the world.
bool out_of_time(Run& r, Clock::time_point start) {
  float over = std::chrono::duration<double>(Clock::now() - start).count() / 60.0 > r.cfg.exit_duration_mins;
  r.mesh.world->all_reduce(&over, 1, ReduceOp::kMax, "--exit-duration-in-mins check", /*blocking=*/true).wait();
  return over > 0;
}

/// The model's vocabulary rows: the tokenizer's vocabulary padded by --make-vocab-size-divisible-by, or
/// --padded-vocab-size; --vocab-size must equal the tokenizer's (uniform kInvalidArgument otherwise).
int64_t model_vocab_size(const TrainConfig& c) {
  const int64_t vocab = make_tokenizer(c.tokenizer_type, c.tokenizer_model)->vocab_size();
  if (c.vocab_size > 0 && c.vocab_size != vocab)
    throw_invalid("--vocab-size {}: the tokenizer ({}) has {} tokens, and coc's vocabulary is the tokenizer's; pass "
                  "--vocab-size {} or leave it out (to pad, use --padded-vocab-size or --make-vocab-size-divisible-by)",
                  c.vocab_size, c.tokenizer_type, vocab, vocab);
  if (c.padded_vocab_size == 0)
    return padded_vocab_size(vocab, c.make_vocab_size_divisible_by, c.tensor_model_parallel_size);
  if (c.padded_vocab_size < vocab || c.padded_vocab_size < c.tensor_model_parallel_size)
    throw_invalid("--padded-vocab-size {} is smaller than the tokenizer's {} tokens (or than tp {}); pass at least {}",
                  c.padded_vocab_size, vocab, c.tensor_model_parallel_size,
                  std::max<int64_t>(vocab, c.tensor_model_parallel_size));
  return c.padded_vocab_size;
}

/// With --load: the RMSNorm epsilon and RoPE theta the checkpoint records (model_config in its metadata; a
/// converted model's rms_norm_eps and rope_theta) replace the preset's, since the weights were trained with them; a
/// flag that says otherwise is refused. Nothing happens when there is no checkpoint yet or it records no config
/// (load_checkpoint reports a missing or damaged file). Every rank reads the same header: the outcome is uniform.
void take_norm_and_rope_from_checkpoint(TrainConfig& cfg) {
  std::optional<SafetensorsHeader> h;
  try {
    const std::optional<int64_t> latest = read_latest(cfg.load);
    if (!latest) return;
    h = read_safetensors_header(checkpoint_shard_path(cfg.load, *latest, 0, 0));
  } catch (const std::exception&) {
    return;  // load_checkpoint names the problem
  }
  const auto m = h->metadata.find("meta");
  const auto meta = nlohmann::json::parse(m == h->metadata.end() ? "{}" : m->second, nullptr, false);
  if (!meta.is_object() || !meta.contains("model_config") || !meta["model_config"].is_object()) return;
  const nlohmann::json& saved = meta["model_config"];
  auto take = [&](const char* key, const char* flag, bool given, float& field) {
    if (!saved.contains(key) || !saved[key].is_number()) return;
    const float v = saved[key].get<float>();
    if (given && v != field)
      throw_invalid("{} {} conflicts with the checkpoint in --load {}, trained with {}; pass {} {} or leave the flag "
                    "out",
                    flag, field, cfg.load, v, flag, v);
    field = v;
  };
  take("norm_epsilon", "--norm-epsilon", cfg.norm_epsilon_given, cfg.model.norm_epsilon);
  take("rotary_base", "--rotary-base", cfg.rotary_base_given, cfg.model.rotary_base);
}

}  // namespace

double EvalLog::ppl() const { return std::exp(std::min(20.0, loss)); }

void validate_train_config(const TrainConfig& cfg, int world) { validate(cfg, world); }

TrainResult train(const TrainConfig& config, const CommOptions& copts) {
  // The automatic CoC choices are memoised per tp communicator address. A process that trains again (coc tune,
  // coc check --train-steps, coc bench train's whole runs) builds new communicators, and one rank may reuse an old
  // address while another does not: that rank would skip the shape key's all-reduce the other waits in (a hang,
  // seen in coc tune). --coc-tuning-cache keeps the timings across runs instead.
  coc_auto_forget();
  const int world = world_size();
  // The model's vocabulary is the tokenizer's, padded (Megatron's --make-vocab-size-divisible-by).
  TrainConfig cfg = config;
  if (config.tensor_model_parallel_size >= 1) cfg.model.vocab_size = model_vocab_size(cfg);
  if (!cfg.load.empty()) take_norm_and_rope_from_checkpoint(cfg);
  validate(cfg, world);
  if (!cfg.save.empty()) check_save_dir(cfg.save);
  Run r(cfg, copts);

  TrainResult result;
  if (!cfg.load.empty())
    result.start_iteration = load_checkpoint(cfg, r.mesh, *r.model, *r.opt, r.grad_sync->sharded(),
                                             r.scaler ? &*r.scaler : nullptr);
  if (cfg.profiling && cfg.profile_step_end >= 0 && cfg.profile_step_end <= result.start_iteration)
    throw_invalid("--profile-step-end {} is not after iteration {}, where this run resumes: no step would be "
                  "profiled and the trace would be empty; profile iterations from {} on",
                  cfg.profile_step_end, result.start_iteration, result.start_iteration);
  if (r.mesh.world->rank() == 0 && result.start_iteration >= cfg.train_iters && cfg.train_iters > 0)
    log::warn("the checkpoint is at iteration {} and --train-iters is {}: nothing to train; raise --train-iters to "
              "continue",
              result.start_iteration, cfg.train_iters);
  log_start(r, copts);

  std::vector<int32_t> tokens, targets;
  // The ranks start the first step together, as after Megatron's barrier "before the start of training step":
  // otherwise its first collective holds the ranks that finished start-up early, and step 1 counts their wait.
  r.mesh.world->barrier("before the first training step");
  const auto run_start = Clock::now();
  int64_t last_saved = -1, end_iter = cfg.train_iters;
  for (int64_t it = result.start_iteration; it < end_iter && !cfg.skip_train; ++it) {
    const bool baseline = choose_schedule(r, it);
    const auto t0 = Clock::now();
    const bool profiled = it >= cfg.profile_step_start && (cfg.profile_step_end < 0 || it < cfg.profile_step_end);
    trace::StepScope step_trace(profiled ? cfg.profile_level : trace::Level::kOff, it);
    r.stats.reset();
    zero_grad(r.params);
    r.grad_sync->take_wait_seconds();  // an evaluation's waits are not this iteration's
    if (r.pipeline) r.pipeline->take_wait_seconds();
    double aux_loss = 0;
    const double loss_scale = r.scaler ? r.scaler->scale() : 0;  // this backward's; update() may change it
    const double loss = forward_backward(r, it, tokens, targets, aux_loss);
    // Sharded data parallelism: its waits inside the module hooks (gathers, reduce-scatters) are exposed too.
    // Pipeline: the waits for stage transfers (the bubble included) are exposed communication too.
    const double hook_wait_ms =
        1000.0 * (r.grad_sync->take_wait_seconds() + (r.pipeline ? r.pipeline->take_wait_seconds() : 0.0));
    const auto t_reduce = Clock::now();
    {
      COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel0, "grad_reduce");
      r.grad_sync->finish();
    }
    const double reduce_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - t_reduce).count() + hook_wait_ms;
    // The schedule counts the optimizer's steps, as Megatron's (its scheduler steps only after a successful
    // update): an --fp16 step skipped for overflow does not advance it, and --no-load-optim restarts it.
    const float lr = lr_at(cfg.optim, r.opt->step_count());
    const double norm = update(r, it, lr);
    IterationLog rec = finish_iteration(r, it, loss, aux_loss, norm, lr, t0, baseline, reduce_ms);
    if (r.scaler) {
      rec.loss_scale = loss_scale;
      rec.skipped = std::isnan(norm);
      rec.skipped_iterations = r.scaler->skipped();
    }
    result.log.push_back(rec);
    if (it == result.start_iteration || (cfg.baseline && it == result.start_iteration + 1))
      log_memory(r, !cfg.baseline ? std::string() : baseline ? "baseline" : "run");
    log_iteration(r, rec, result.start_iteration, run_start);
    if (cfg.on_iteration) cfg.on_iteration(rec);
    // Megatron does not evaluate with --eval-iters 0.
    if (cfg.eval_interval > 0 && cfg.eval_iters > 0 && rec.iteration % cfg.eval_interval == 0)
      run_evaluation(r, result, {rec.iteration, 0, Split::kValid, /*at_end=*/false}, tokens, targets);
    if (!cfg.save.empty() && cfg.save_interval > 0 && rec.iteration % cfg.save_interval == 0) {
      COC_TRACE_SCOPE(trace::Cat::kHostWork, trace::Level::kLevel0, "checkpoint");
      save_checkpoint(cfg, r.mesh, *r.model, *r.opt, r.grad_sync->sharded(), r.scaler ? &*r.scaler : nullptr,
                      rec.iteration);
      last_saved = rec.iteration;
    }
    if (cfg.exit_interval > 0 && rec.iteration % cfg.exit_interval == 0 && rec.iteration < end_iter) {
      if (r.mesh.world->rank() == 0) log::info("exiting at iteration {} (--exit-interval {})", rec.iteration,
                                               cfg.exit_interval);
      end_iter = rec.iteration;
    }
    if (cfg.exit_duration_mins > 0 && rec.iteration < end_iter && out_of_time(r, run_start)) {
      if (r.mesh.world->rank() == 0) log::info("exiting at iteration {} (--exit-duration-in-mins {})", rec.iteration,
                                               cfg.exit_duration_mins);
      end_iter = rec.iteration;
    }
  }
  if (r.mesh.world->rank() == 0 && cfg.progress_bar && !cfg.quiet) std::printf("\r\033[K");
  if (cfg.skip_train) {
    if (r.mesh.world->rank() == 0 && !cfg.quiet) log::info("skipping training (--skip-train is on) ...");
    evaluate_at_end(r, result, result.start_iteration, tokens, targets);
    if (!cfg.logits_out.empty()) write_logits(logits_of(r), cfg, *r.tokenizer, r.mesh.world->rank());
    if (cfg.sample_length > 0) result.sample = generate(logits_of(r), cfg, *r.tokenizer);
    return result;
  }
  const int64_t final_iter = std::max(result.start_iteration, end_iter);
  if (!cfg.save.empty() && final_iter != last_saved && final_iter > result.start_iteration)
    save_checkpoint(cfg, r.mesh, *r.model, *r.opt, r.grad_sync->sharded(), r.scaler ? &*r.scaler : nullptr,
                    final_iter);
  // Megatron exits inside train() when --exit-interval or --exit-duration-in-mins stops it, before this evaluation.
  if (end_iter == cfg.train_iters) evaluate_at_end(r, result, final_iter, tokens, targets);
  if (!cfg.logits_out.empty()) write_logits(logits_of(r), cfg, *r.tokenizer, r.mesh.world->rank());
  if (cfg.sample_length > 0) result.sample = generate(logits_of(r), cfg, *r.tokenizer);
  return result;
}

}  // namespace coc
