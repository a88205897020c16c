// The training loop of `coc train` (Megatron's pretrain(): train_step, gradient reduction, optimizer step,
// logging, checkpointing), for the byte-level LLaMA decoder over tp × dp ranks.
//
// One iteration = global_batch_size sequences = (global / (micro · dp)) micro-batches per dp rank, accumulated into
// the fp32 gradients; then: TP all-reduce of sequence-parallel partial gradients (norm weights under SP), DP
// all-reduce (mean) of all gradients, global grad-norm (TP all-reduce of squared norms, replicated parameters
// counted once), clipping, AdamW with warmup + cosine decay. With --pipeline-model-parallel-size P > 1 each rank
// holds one stage and the micro-batches run by the 1F1B schedule (model/pipeline_schedule.h); the loss is the last
// stage's, broadcast over pp, and the grad norm sums every stage's squares (docs/pipeline.md).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coc/comm/communicator.h"
#include "coc/kernels/block_attention.h"
#include "coc/model/gpt_dataset.h"
#include "coc/model/loss_scaler.h"
#include "coc/model/model_config.h"
#include "coc/model/optimizer.h"
#include "coc/model/decoder.h"
#include "coc/model/transformer_layer.h"
#include "coc/overlap/coc_ops.h"
#include "coc/parallel/context.h"
#include "coc/parallel/fsdp.h"
#include "coc/parallel/moe.h"
#include "coc/runtime/tracer.h"

namespace coc {

struct IterationLog;
struct EvalLog;

struct TrainConfig {
  ModelConfig model;
  OptimizerConfig optim;
  int tensor_model_parallel_size = 1;
  bool sequence_parallel = false;
  int coc_parallel_num = 4;          ///< CocOptions::kAuto (0) = --coc-parallel-num auto
  CocCommAlgo coc_comm_algo = CocCommAlgo::kCollective;  ///< --coc-comm-algo
  std::string customized_coc;        ///< --customized-coc: JSON {"[m, k, n]": N} or @FILE (parse_customized_coc)
  std::string coc_tuning_cache;      ///< --coc-tuning-cache FILE: auto's timed choices across runs (overlap/tuning_cache.h)
  bool deterministic = false;
  /// --gemm-backend: the fp32 GEMM library (kernels/gemm.h); unset leaves the process's (COC_GEMM_BACKEND's, or
  /// auto). coc bench train --baseline may switch it.
  std::optional<GemmBackend> gemm_backend;
  /// --bf16 (docs/mixed-precision.md): fp32 master weights and optimizer state; every GEMM in bf16 with fp32
  /// accumulation (set_gemm_compute_type) except the MoE router's; the activations a bf16 model stores rounded to
  /// bf16 values (store_as_compute_type). coc bench train --baseline may switch it (--no-bf16).
  bool bf16 = false;
  /// --fp16: the same with fp16 values (the GEMMs multiply them on fp32 kernels: no target CPU has fp16 dot
  /// products) and loss scaling (`loss_scale`, model/loss_scaler.h); overflowing steps are skipped and counted.
  bool fp16 = false;
  LossScaleConfig loss_scale;
  /// --grad-reduce-in-bf16 (with --bf16): the data-parallel gradient reduction moves bf16 (half the bytes); the sum is
  /// taken in fp32 and rounded to bf16 (FsdpOptions::grad_reduce_dtype). Off: fp32, Megatron's default.
  bool grad_reduce_in_bf16 = false;
  /// The compute type of the GEMMs and stored activations: kF16, kBF16 or kF32.
  DType compute_type() const { return fp16 ? DType::kF16 : bf16 ? DType::kBF16 : DType::kF32; }
  int64_t coc_min_chunk_rows = 1;
  bool coc_fused_kernel = false;     ///< --coc-fused-kernel (ParallelContext::fused_kernel)
  bool use_mc2 = false;              ///< --use-mc2 (ParallelContext::mc2)
  bool tp_comm_bulk_wgrad = true;    ///< --tp-comm-bulk-wgrad (ParallelContext::tp_comm_bulk_wgrad)
  bool delay_wgrad_compute = true;   ///< --delay-wgrad-compute (ParallelContext::delay_wgrad_compute)
  VocabComm vocab_comm = VocabComm::kAuto;  ///< --vocab-parallel-comm (ParallelContext::vocab_comm)
  bool delay_column_wgrad = true;    ///< --delay-column-wgrad (ParallelContext::delay_column_wgrad)
  bool attention_dense_pipeline = true;  ///< --attention-dense-pipeline (ParallelContext::attention_dense_pipeline)
  /// --attention-dense-backward-pipeline (ParallelContext::attention_dense_backward_pipeline)
  bool attention_dense_backward_pipeline = true;
  bool swiglu_down_pipeline = true;  ///< --swiglu-down-pipeline (ParallelContext::swiglu_down_pipeline)
  /// --attention-qkv-backward-pipeline (ParallelContext::attention_qkv_backward_pipeline)
  bool attention_qkv_backward_pipeline = true;
  /// --swiglu-down-backward-pipeline (ParallelContext::swiglu_down_backward_pipeline)
  bool swiglu_down_backward_pipeline = true;
  /// --overlap-forward-micro-batches (coc's own, beyond Megatron): micro-batches 2j and 2j + 1 of an iteration run
  /// their forwards interleaved, layer by layer (Decoder::forward_pair), so that each one's attention and SwiGLU
  /// fill the waits of the other's TP transfers; then each runs its head and backward, in micro-batch order, so the
  /// bits are the sequential loop's. Keeps two micro-batches' activations. Needs two or more micro-batches per
  /// iteration; not with pipeline parallelism, ring attention (cp > 1), MoE, recomputation or a sharded strategy.
  /// coc bench train --baseline may switch it.
  bool overlap_forward_micro_batches = false;
  // Context parallelism (parallel/ring_attention.h, docs/semantics.md §5): --context-parallel-size (ring attention,
  // --context-parallel-algo megatron_cp_algo), --use-cp-send-recv-overlap, --cp-window-size, --attention-mask-type.
  // With cp > 1 or the general mask, attention runs through the ring (over a cp group of size 1 for cp = 1).
  int context_parallel_size = 1;
  bool cp_send_recv_overlap = false;
  // Pipeline parallelism (model/pipeline_schedule.h, docs/pipeline.md): --pipeline-model-parallel-size P (1F1B over
  // P stages), --decoder-first/last-pipeline-num-layers (an uneven split), --num-virtual-stages-per-pipeline-rank
  // (pipeline_split.virtual_stages: the interleaved schedule), --overlap-p2p-communication (the next micro-batch's
  // receive posted before the current one computes).
  int pipeline_model_parallel_size = 1;
  PipelineSplit pipeline_split;
  bool overlap_p2p_communication = false;
  int cp_window_size = 1;
  AttnMask attention_mask = AttnMask::kCausal;
  // Sharded data parallelism (parallel/fsdp.h, docs/semantics.md §4): --data-parallel-sharding-strategy,
  // --num-to-forward-prefetch, --num-to-backward-prefetch (optim_grads_params only).
  ShardingStrategy data_parallel_sharding_strategy = ShardingStrategy::kNoShard;
  int num_to_forward_prefetch = 1;
  int num_to_backward_prefetch = 1;
  /// --overlap-grad-reduce (no_shard): each module's data-parallel gradient all-reduce is posted from its
  /// post-backward hook in the last micro-batch (OverlappedGradSync, grad_sync.h). The sharded strategies always
  /// post their reduce-scatters there, so it changes nothing for them. On by default, as every overlap that keeps
  /// the bits (issue 36; Megatron's default is off): the blocking reduction is --no-overlap-grad-reduce.
  bool overlap_grad_reduce = true;
  /// Activation recomputation (--recompute-granularity, --recompute-method, --recompute-num-layers;
  /// model/transformer_layer.h): memory for time, the same results. Switchable under --baseline.
  RecomputeConfig recompute;
  /// Tests only (COC_TEST_FSDP_DELAY_SEED): FsdpOptions::random_delay_seed.
  uint64_t fsdp_random_delay_seed = 0;
  // Mixture of experts (model.num_experts > 0; parallel/moe.h, docs/semantics.md §6): the expert-parallel size
  // (--expert-model-parallel-size; ep subdivides the dp × cp ranks) and the MoE layers' run settings (capacity
  // factor, aux loss coefficient, --ep-dispatcher, mc2 chunks, fixed router; the shapes come from `model`, and
  // determinism from `deterministic`).
  int expert_model_parallel_size = 1;
  MoeConfig moe;
  int64_t micro_batch_size = 4;
  int64_t global_batch_size = 16;
  int64_t train_iters = 200;
  int64_t log_interval = 1;
  uint64_t seed = 1234;
  std::string data_path;             ///< empty: the built-in fortunes corpus; else TrainingData's forms
  std::string split;                 ///< --split "98,2,0" (empty: everything trains)
  std::string tokenizer_type = "ByteTokenizer";  ///< --tokenizer-type (model/tokenizer.h)
  std::string tokenizer_model;       ///< --tokenizer-model FILE
  int64_t make_vocab_size_divisible_by = 1;  ///< Megatron's padding (1 keeps the tokenizer's vocabulary)
  int64_t eval_interval = 0;         ///< --eval-interval: evaluate every N iterations (0: never)
  int64_t eval_iters = 0;            ///< --eval-iters: global batches of validation data per evaluation
  bool skip_train = false;           ///< --skip-train: evaluate once at the loaded iteration, train nothing
  std::string logits_out;            ///< --logits-out FILE: fp32 [len, vocab] logits of the prompt's tokens
  std::string save, load;            ///< checkpoint directories (empty: none)
  /// --no-load-optim (false): load the weights and the iteration, but start AdamW's moments and the learning-rate
  /// schedule afresh, as Megatron does (its scheduler state is saved with the optimizer's).
  bool load_optim = true;
  /// --exit-on-missing-checkpoint: a --load folder without latest_checkpointed_iteration.txt is an error instead of
  /// a warning and a start from scratch (Megatron's).
  bool exit_on_missing_checkpoint = false;
  /// --norm-epsilon / --rotary-base were given: with --load, a checkpoint that records other values is refused;
  /// when not given, the checkpoint's values are used (a converted model's rms_norm_eps and rope_theta).
  bool norm_epsilon_given = false, rotary_base_given = false;
  /// --finetune: load the weights only and start at iteration 0 with a fresh optimizer (Megatron's).
  bool finetune = false;
  /// --exit-interval N: stop after the first iteration that is a multiple of N (saving a checkpoint first when
  /// --save is given), as Megatron's; 0: train to --train-iters.
  int64_t exit_interval = 0;
  /// --exit-duration-in-mins M: stop after the first iteration that ends more than M minutes after training began
  /// on any rank (saving a checkpoint first when --save is given), as Megatron's; 0: no limit.
  double exit_duration_mins = 0;
  /// --vocab-size V: checked against the tokenizer's vocabulary (Megatron uses it only for its NullTokenizer);
  /// 0: not given.
  int64_t vocab_size = 0;
  /// --padded-vocab-size P (MindSpeed-LLM's): the model's vocabulary rows, >= the tokenizer's, instead of
  /// --make-vocab-size-divisible-by's padding; 0: not given.
  int64_t padded_vocab_size = 0;
  int64_t save_interval = 0;         ///< 0: save only at the end (when --save is given)
  int64_t sample_length = 160;       ///< bytes generated at the end (0: none)
  std::string sample_prompt = "The ";
  float sample_temperature = 0.7f;
  bool progress_bar = false;         ///< draw a progress bar on stdout (rank 0)
  bool quiet = false;                ///< no per-iteration lines (used by `coc check --train-steps`)
  /// `coc bench train` (--baseline): when set, the 0-based even iterations run the baseline's *switchable*
  /// settings and the odd ones this config's, so that two settings are timed in one run, seconds apart
  /// (docs/performance.md). Only the settings that can change between iterations are read from it: the CoC schedule
  /// (coc_parallel_num, coc_comm_algo, customized_coc, coc_min_chunk_rows, coc_fused_kernel, use_mc2), the backward
  /// overlaps (tp_comm_bulk_wgrad, delay_wgrad_compute), cp_send_recv_overlap, the FSDP prefetch depths
  /// (num_to_forward/backward_prefetch), overlap_grad_reduce, the recomputation (recompute), the MoE dispatcher
  /// (moe.dispatcher, moe.mc2_chunks), bf16, overlap_forward_micro_batches and overlap_p2p_communication (pipeline
  /// runs switch at the same iteration boundary on every stage); every other field of the baseline is ignored (the model, mesh, data and optimizer
  /// are built once, from this config). With --deterministic every switchable setting gives the same bits, so the loss
  /// curve is the one either side alone would give. Null: every iteration runs this config.
  std::shared_ptr<const TrainConfig> baseline;
  /// The names of the two sides in the per-iteration log lines (" | N=1", " | overlap") when `baseline` is set.
  std::string baseline_label = "baseline", run_label = "run";
  /// --profile: the tracer level of this rank's profiled iterations (kOff: this rank is not profiled), which are
  /// the 0-based iterations in [profile_step_start, profile_step_end) (end -1: to the last). docs/profiling.md.
  trace::Level profile_level = trace::Level::kOff;
  int64_t profile_step_start = 0, profile_step_end = -1;
  bool profiling = false;  ///< --profile was given (true on every rank, also those whose profile_level is kOff)
  /// Called by train() on every rank right after each iteration's log line (whether or not the line is printed,
  /// i.e. every iteration), with that iteration's record; `coc train --log-json/--tensorboard-dir` write their
  /// files from it. Runs on the training thread: a slow callback slows training. Empty: nothing is called.
  std::function<void(const IterationLog&)> on_iteration;
  /// Called by train() on every rank after each evaluation's log lines (--eval-interval, the end of training, and
  /// --skip-train), with its record; `coc train --log-json/--tensorboard-dir` write it. Empty: nothing is called.
  std::function<void(const EvalLog&)> on_evaluation;

  /// The overlap flags above, for make_parallel_context.
  OverlapConfig overlap() const {
    return {sequence_parallel, coc_parallel_num, coc_comm_algo,    customized_coc,      deterministic,
            coc_min_chunk_rows, coc_fused_kernel, use_mc2, tp_comm_bulk_wgrad, delay_wgrad_compute,
            vocab_comm,         delay_column_wgrad, attention_dense_pipeline, attention_dense_backward_pipeline,
            swiglu_down_pipeline, attention_qkv_backward_pipeline, swiglu_down_backward_pipeline,
            bf16 ? DType::kBF16 : DType::kF32};
  }
};

struct IterationLog {
  int64_t iteration = 0;   ///< 1-based
  double loss = 0;         ///< language-model loss: mean over the global batch (nats)
  /// MoE: the load-balancing loss (times its coefficient), mean over the MoE layers and micro-batches (Megatron's
  /// logged load_balancing_loss); the objective adds it, summed over the layers, to `loss`. 0 for a dense model.
  double load_balancing_loss = 0;
  double lr = 0;
  double grad_norm = 0;    ///< before clipping
  double elapsed_ms = 0;   ///< wall time of the iteration, max over ranks
  double tokens_per_s = 0;
  /// Megatron's "throughput per GPU (TFLOP/s/GPU)": ModelConfig::num_floating_point_operations of the global batch
  /// over elapsed_ms × 1e12 × the world size (TFLOP/s per rank; model FLOPs, so recomputation does not raise it).
  double tflops_per_rank = 0;
  double gemm_ms = 0, comm_wait_ms = 0;  ///< this rank's time in CoC GEMMs and in waiting for their collectives
  /// This rank's communication that nothing hid (ms): comm_wait_ms plus the gradient reductions after backward
  /// (sequence-parallel and data-parallel all-reduces, which run with nothing to overlap), and under pipeline
  /// parallelism the waits for stage transfers (the bubble included).
  double exposed_comm_ms = 0;
  bool baseline = false;   ///< TrainConfig::baseline is set and this iteration ran the baseline's settings
  /// --fp16: the loss scale this iteration's backward used, whether its step was skipped (inf/NaN gradients; the
  /// grad norm is then NaN), and the skipped steps so far. 0 / false without --fp16.
  double loss_scale = 0;
  bool skipped = false;
  int64_t skipped_iterations = 0;
};

/// One evaluation (Megatron's evaluate_and_print_results): of the validation split every --eval-interval
/// iterations, and of the validation and the test split once training ends (or under --skip-train).
struct EvalLog {
  int64_t iteration = 0;  ///< iterations trained when it ran
  double loss = 0;        ///< mean over eval_iters global batches (nats)
  Split split = Split::kValid;  ///< kValid or kTest
  /// The evaluation after training (or --skip-train's): Megatron's line then reads "at iteration N on validation
  /// set" (or "on test set") instead of "at iteration N".
  bool at_end = false;
  /// Megatron's perplexity: exp(min(20, loss)), capped to stay finite.
  double ppl() const;
};

struct TrainResult {
  std::vector<IterationLog> log;  ///< iterations run in this invocation
  std::vector<EvalLog> eval;      ///< evaluations run in this invocation
  std::string sample;             ///< generated text (empty when sample_length == 0)
  int64_t start_iteration = 0;    ///< iterations already done when this run started (from --load)
};

/// Validates `cfg` against the world size (uniform kInvalidArgument errors naming the flag and the fix), builds the
/// process groups, the model and the optimizer, loads a checkpoint if asked, trains, saves, samples.
/// `comm` carries engine/timeout/fingerprint options. Collective over MPI_COMM_WORLD.
TrainResult train(const TrainConfig& cfg, const CommOptions& comm);
/// Checks that every rank of `world` was given the same configuration: the model, the layout, the data and every
/// setting that decides which collectives run or their order (config_parts in trainer.cpp), plus `extra` (key:
/// the flags, value: their setting; `coc train` adds the profiler's and the metrics'). Collective over `world`:
/// call it before any other collective that a differing flag would skip. Throws a uniform kInvalidArgument naming
/// the first differing rank and up to three differing settings with both ranks' values. train() calls it first.
void check_same_config(Communicator& world, const TrainConfig& c,
                       const std::vector<std::pair<std::string, std::string>>& extra = {});
/// Whether `a` and `b` train alike: every setting check_same_config compares, and the fp32 GEMM library (coc bench
/// train warns when its --baseline changes none of them).
bool same_training_settings(const TrainConfig& a, const TrainConfig& b);
/// train()'s checks of `cfg` against `world` ranks alone, without building anything (coc tune --budget 0 writes a
/// configuration it never runs). Throws the same uniform kInvalidArgument errors.
void validate_train_config(const TrainConfig& cfg, int world);

}  // namespace coc
