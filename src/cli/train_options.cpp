#include "cli/train_options.h"

#include "cli/did_you_mean.h"

#include "coc/parallel/fsdp.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <set>

#include "coc/comm/process.h"
#include "coc/core/env_registry.h"
#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc/parallel/fsdp.h"

namespace coc::cli {

namespace {
/// CLI11 check: a whole number >= 0 (CLI11's NonNegativeNumber prints its range as a 300-digit double).
CLI::Validator integer_at_least(int64_t lo) {
  return CLI::Validator(
      [lo](const std::string& v) {
        int64_t x = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
        return ec == std::errc() && end == v.data() + v.size() && x >= lo
                   ? std::string()
                   : fmt::format("must be an integer >= {} (got '{}')", lo, v);
      },
      "");
}
CLI::Validator non_negative_integer() { return integer_at_least(0); }
}  // namespace

void apply_yaml_config(CLI::App* cmd, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw_invalid("--config {}: not a readable file; pass a YAML file such as configs/default.yaml", path);
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw_invalid("--config {}: cannot read the file; pass an existing YAML file", path);
  } catch (const YAML::Exception& e) {
    throw_invalid("--config {}: not valid YAML ({}); write one `flag-name: value` per line", path, e.what());
  }
  if (root.IsNull()) return;
  if (!root.IsMap()) throw_invalid("--config {}: the file must map flag names to values, e.g. `lr: 0.003`", path);
  std::set<std::string> seen;  // yaml-cpp keeps the first of two equal keys without a word
  for (const auto& kv : root) {
    std::string key = kv.first.as<std::string>();
    if (key.rfind("--", 0) == 0) key = key.substr(2);
    if (!seen.insert(key).second)
      throw_invalid("--config {}: key '{}' appears twice; keep one line for it", path, key);
    CLI::Option* opt = nullptr;
    try {
      opt = cmd->get_option("--" + key);
    } catch (const CLI::OptionNotFound&) {
      const std::string near = nearest_flag(*cmd, "--" + key);
      throw_invalid("--config {}: unknown key '{}'{}; keys are the flag names of `coc {} --help` without the dashes",
                    path, key, near.empty() ? "" : " (did you mean '" + near.substr(2) + "'?)", cmd->get_name());
    }
    if (key == "config") throw_invalid("--config {}: a config file cannot name another config file", path);
    if (opt->count() > 0) continue;  // the command line wins
    if (!kv.second.IsScalar())
      throw_invalid("--config {}: key '{}' must have a single value (`{}: VALUE`; a flag takes true or false)", path,
                    key, key);
    std::string value = kv.second.as<std::string>();
    if (const std::string type = opt->get_type_name();
        value.empty() && (type == "INT" || type == "UINT" || type == "FLOAT" || type == "NUMBER"))
      throw_invalid("--config {}: '{}' has an empty value: give it one {}, or remove the line", path, key, type);
    try {
      // A flag's negated name (`no-sequence-parallel: true`) names the same option: the value it stands for is
      // the inverse (CLI11 inverts it on the command line; add_result alone would not).
      value = opt->get_flag_value(key, value);
      opt->add_result(value);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      if (opt->get_expected_max() == 0)
        throw_invalid("--config {}: '{}' is a switch: give it true or false, not '{}'", path, key, value);
      if (dynamic_cast<const CLI::ConversionError*>(&e))
        throw_invalid("--config {}: '{}' takes one {}, not '{}'", path, key, opt->get_type_name(), value);
      throw_invalid("--config {}: bad value '{}' for '{}': {}", path, value, key, e.what());
    }
  }
}

namespace {
/// The learning-rate schedule (Megatron's OptimizerParamScheduler; coc/model/optimizer.h).
void add_schedule_flags(CLI::App* cmd, TrainOptions& o) {
  OptimizerConfig& op = o.cfg.optim;
  cmd->add_option("--lr", op.lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--min-lr", op.min_lr, "Learning rate at the end of the decay")->capture_default_str();
  cmd->add_option("--lr-decay-style", o.lr_decay_style,
                  "After warmup: linear, cosine, constant, inverse-square-root or WSD (Megatron's formulas; coc's "
                  "default is cosine, Megatron's linear)")
      ->capture_default_str();
  cmd->add_option("--lr-warmup-iters", o.lr_warmup_iters, "Linear warmup iterations (default: train-iters / 10)")
      ->check(non_negative_integer());
  cmd->add_option("--lr-warmup-fraction", o.lr_warmup_fraction,
                  "Warmup as a fraction of --lr-decay-iters (Megatron's; instead of --lr-warmup-iters)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--lr-warmup-init", op.init_lr, "Learning rate at the start of warmup (Megatron's)")
      ->capture_default_str();
  cmd->add_option("--lr-decay-iters", o.lr_decay_iters, "The decay ends here (default: train-iters)")
      ->check(non_negative_integer());
  cmd->add_option("--train-samples", o.train_samples,
                  "Megatron's sample-based length: --train-iters = samples / --global-batch-size (rounded down)")
      ->check(non_negative_integer());
  cmd->add_option("--lr-decay-samples", o.lr_decay_samples,
                  "The decay ends after this many samples (default: --train-samples; instead of --lr-decay-iters)")
      ->check(non_negative_integer());
  cmd->add_option("--lr-warmup-samples", o.lr_warmup_samples,
                  "Warmup over this many samples (instead of --lr-warmup-iters)")
      ->check(non_negative_integer());
  cmd->add_option("--lr-wsd-decay-style", o.lr_wsd_decay_style,
                  "WSD's anneal: linear, cosine, exponential or minus_sqrt")
      ->capture_default_str();
  cmd->add_option("--lr-wsd-decay-iters", op.wsd_decay_iters,
                  "WSD: anneal over the last N iterations before --lr-decay-iters")
      ->check(non_negative_integer());
  cmd->add_option("--vocab-size", o.cfg.vocab_size,
                  "Megatron's vocabulary size: checked against the tokenizer's (coc's vocabulary is the tokenizer's)")
      ->check(integer_at_least(1));
  cmd->add_option("--padded-vocab-size", o.cfg.padded_vocab_size,
                  "MindSpeed-LLM's: the model's vocabulary rows (>= the tokenizer's), instead of "
                  "--make-vocab-size-divisible-by's padding")
      ->check(integer_at_least(1));
}

/// Tokenizer, data, evaluation and model-shape flags of real models (Megatron's names).
void add_data_flags(CLI::App* cmd, TrainOptions& o) {
  TrainConfig& c = o.cfg;
  cmd->add_option("--tokenizer-type", c.tokenizer_type,
                  "ByteTokenizer (bytes, vocabulary 256) or SentencePieceTokenizer (needs --tokenizer-model)")
      ->capture_default_str();
  cmd->add_option("--tokenizer-model", c.tokenizer_model, "SentencePiece model file (e.g. tokenizer.model)");
  cmd->add_option("--make-vocab-size-divisible-by", c.make_vocab_size_divisible_by,
                  "Pad the vocabulary to a multiple of this × tp (Megatron's default is 128; 1 keeps it as is)")
      ->check(integer_at_least(1))
      ->capture_default_str();
  cmd->add_option("--split", c.split,
                  "Train,validation,test weights of --data-path, e.g. 98,2,0 (default: everything trains)");
  cmd->add_option("--eval-interval", c.eval_interval, "Evaluate on the validation split every N iterations (0: never)")
      ->check(non_negative_integer())
      ->capture_default_str();
  cmd->add_option("--eval-iters", c.eval_iters, "Global batches of validation (and test) data per evaluation; after training the "
                  "validation and the test split are evaluated, as Megatron's pretrain does (0: no evaluation)")
      ->check(non_negative_integer())
      ->capture_default_str();
  cmd->add_flag("--skip-train", c.skip_train, "Train nothing: evaluate the validation and the test split at the loaded iteration "
                "(--load), as Megatron's --skip-train");
  cmd->add_option("--logits-out", c.logits_out,
                  "After training, write the logits after each token of --sample-prompt to FILE (fp32 [tokens, "
                  "vocab], rank 0)");
  cmd->add_flag("--group-query-attention", o.group_query_attention,
                "Grouped-query attention: --num-query-groups key/value heads shared by the query heads");
  cmd->add_option("--num-query-groups", o.num_query_groups, "Key/value groups with --group-query-attention")
      ->check(integer_at_least(1))
      ->capture_default_str();
}
}  // namespace

void add_train_flags(CLI::App* cmd, TrainOptions& o) {
  TrainConfig& c = o.cfg;
  // A flag given twice takes the last value, as in Megatron's argparse.
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("--config", o.config_path,
                  "YAML file of `flag-name: value` lines (e.g. configs/default.yaml); command-line flags override it");
  // Parallelism and overlap.
  cmd->add_option("--tensor-model-parallel-size,--tp", o.tp,
                  "Tensor-parallel group size T (0 = auto: the largest that divides the world size, the heads and the "
                  "FFN width)")->capture_default_str();
  // CLI11 prints the negated name as "--no-sequence-parallel{false}", which reads like a default: say it in words.
  cmd->add_flag("--sequence-parallel,!--no-sequence-parallel", c.sequence_parallel,
                std::string("Megatron sequence parallelism: norms/residuals split along the sequence; AG/RS replace "
                            "AR (default here: ") +
                    (c.sequence_parallel ? "on)" : "off)"));
  cmd->add_option("--coc-parallel-num", c.coc_parallel_num,
                  "CoC chunk count N: split each TP GEMM along m into N chunks pipelined with their collectives; "
                  "1 = plain Megatron order, unchunked; auto = time serial and N in {4,8,16} (collective and p2p) "
                  "once per shape (3 rounds, then a run-off of the best two against serial) and keep the lowest median "
                  "(-v shows the choice)")
      ->transform(CLI::Validator(
          [](std::string& v) {
            // CocOptions::kAuto is 0, so a literal 0 must not sneak in as "auto".
            if (v == "auto") {
              v = "0";
              return std::string();
            }
            if (v.find_first_not_of(" +0") == std::string::npos)
              return std::string("must be >= 1 or auto (got " + v + "); use 1 for no overlap, 2-16, or auto");
            return std::string();
          },
          "", "auto"))
      ->type_name("INT|auto")
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--coc-comm-algo", [&c](const std::string& v) { c.coc_comm_algo = parse_comm_algo(v); },
         "How chunks communicate: 'collective' (one MPI collective per chunk, MindSpeed's CoC) or 'p2p' "
         "(point-to-point: reduce-scatter and all-reduce send peers' rows first, all-gather multiplies its own "
         "rows first; in deterministic mode with the same bits as 'collective'); ignored by --coc-parallel-num auto")
      ->default_str("collective");
  cmd->add_option_function<std::string>(
         "--vocab-parallel-comm", [&c](const std::string& v) { c.vocab_comm = parse_vocab_comm(v); },
         "With --sequence-parallel, what the vocabulary-parallel embedding and output layer send across the TP "
         "group: 'activations' (Megatron: the [tokens, hidden] rows), 'weights' (coc's own: the [vocab, hidden] "
         "weights and their gradients; same model, other rounding) or 'auto' (weights when the vocabulary is "
         "smaller than the micro-batch's tokens and the full weight fits 64 MiB)")
      ->default_str("auto");
  cmd->add_option("--customized-coc", c.customized_coc,
                  "MindSpeed's per-shape N (customized_coc): JSON object {\"[m, k, n]\": N or \"auto\", ...} keyed by "
                  "each rank's GEMM shape, or @FILE holding it; shapes not listed use --coc-parallel-num");
  cmd->add_option("--coc-tuning-cache", c.coc_tuning_cache,
                  "JSON file where --coc-parallel-num auto keeps its timed choices per op and shape, group size, link "
                  "and MPI library: the next run takes them without timing (another link, library or coc version "
                  "is timed again); created if missing, rewritten atomically by rank 0; a corrupt file is refused")
      ->type_name("FILE");
  cmd->add_option("--coc-min-chunk-rows", c.coc_min_chunk_rows,
                  "Lower N until chunks have at least this many rows per rank (small chunks cost more than they "
                  "hide); 1 disables")
      ->check(integer_at_least(1))
      ->capture_default_str();
  cmd->add_flag("--use-deter-comp,--deterministic", c.deterministic,
                "Deterministic reductions: fixed rank order, bitwise identical across runs and across N");
  cmd->add_option("--gemm-backend", o.gemm_backend,
                  "fp32 GEMM library: auto (oneDNN where it runs AVX-512 kernels, OpenBLAS elsewhere), onednn or "
                  "openblas; default: COC_GEMM_BACKEND, else auto (coc's own; bf16 GEMMs always run on oneDNN). "
                  "coc bench train --baseline may switch it")
      ->check(CLI::IsMember({"auto", "onednn", "openblas"}));
  cmd->add_flag("--coc-fused-kernel", c.coc_fused_kernel,
                "Fused on-node kernels: every TP GEMM+collective runs as one routine over node-shared memory (MPI-3 "
                "shared window; falls back to the chunked pipeline across nodes, -v says why)");
  cmd->add_flag("--use-mc2", c.use_mc2,
                "MC2 placement of the fused kernels (needs --sequence-parallel): column fwd all_gather_matmul, row "
                "fwd matmul_reduce_scatter, row bwd all_gather_matmul_v2; column bwd stays chunked");
  cmd->add_flag("--tp-comm-bulk-wgrad,!--disable-tp-comm-bulk-wgrad", c.tp_comm_bulk_wgrad,
                "Backward of the column-parallel layers: the dX all-reduce (reduce-scatter with SP) stays in flight "
                "while the dW GEMM runs, with the progress engine polling (Megatron/TransformerEngine's bulk wgrad "
                "overlap); under --coc-parallel-num auto or 1 it is one non-blocking collective, an explicit N keeps "
                "its chunks. On by default; same bits on and off at tp 2 and with --deterministic (at tp >= 3 otherwise "
                "the non-blocking reduction may sum in another order); coc bench train --baseline may switch it")
      ->capture_default_str();
  cmd->add_flag("--delay-wgrad-compute,!--no-delay-wgrad-compute", c.delay_wgrad_compute,
                "Delay each row-parallel layer's weight gradient to the next column-parallel layer's backward, where "
                "it runs while that layer's dX reduction is in flight (Megatron-core's name; coc goes beyond "
                "Megatron, which delays the wgrad only to overlap MoE's all-to-all). On by default; same bits on and "
                "off; coc bench train --baseline may switch it")
      ->capture_default_str();
  cmd->add_flag("--delay-column-wgrad,!--no-delay-column-wgrad", c.delay_column_wgrad,
                "With --delay-wgrad-compute and --sequence-parallel: the MLP down projection's delayed weight "
                "gradient runs in the attention output projection's backward, while that layer's dY all-gather is in "
                "flight, instead of in the gate_up layer's, whose own dW GEMM alone hides its dX reduce-scatter "
                "(coc's own, beyond Megatron). On by default; same bits on and off; coc bench train --baseline may "
                "switch it")
      ->capture_default_str();
  cmd->add_flag("--attention-dense-pipeline,!--no-attention-dense-pipeline", c.attention_dense_pipeline,
                "Compute attention query block by query block as the attention output projection's chunked GEMM asks "
                "for its rows, so that its reduce-scatter (all-reduce without SP) of one chunk flies while attention "
                "computes the next (coc's own, beyond Megatron). On by default; same bits on and off; coc bench "
                "train --baseline may switch it")
      ->capture_default_str();
  cmd->add_flag("--attention-dense-backward-pipeline,!--no-attention-dense-backward-pipeline",
                c.attention_dense_backward_pipeline,
                "With --sequence-parallel: the attention output projection's backward all-gathers dY in segments, "
                "last rows first, and attention's backward runs each query block as soon as its rows are in, while "
                "the later segments fly (coc's own, beyond Megatron; not with ring attention). On by default; same "
                "bits on and off with --deterministic; coc bench train --baseline may switch it")
      ->capture_default_str();
  cmd->add_flag("--swiglu-down-pipeline,!--no-swiglu-down-pipeline", c.swiglu_down_pipeline,
                "Compute the SwiGLU activation's rows as the MLP down projection's chunked GEMM asks for them, so "
                "that SwiGLU runs while the chunks before are in flight (coc's own, beyond Megatron). On by default; "
                "same bits on and off; coc bench train --baseline may switch it")
      ->capture_default_str();
  cmd->add_flag("--attention-qkv-backward-pipeline,!--no-attention-qkv-backward-pipeline",
                c.attention_qkv_backward_pipeline,
                "The qkv layer's backward reduces dX in chunks, last rows first, and attention's backward computes "
                "each chunk's query blocks just before its GEMM, so that the reduction of the last rows flies while "
                "attention computes the earlier ones (coc's own, beyond Megatron; not with ring attention). On by "
                "default; same bits on and off with --deterministic; coc bench train --baseline may switch it")
      ->capture_default_str();
  cmd->add_flag("--swiglu-down-backward-pipeline,!--no-swiglu-down-backward-pipeline",
                c.swiglu_down_backward_pipeline,
                "With --sequence-parallel: the MLP down projection's backward all-gathers dY in segments and SwiGLU's "
                "backward runs on each segment's rows as they are computed, while the later segments fly (coc's own, "
                "beyond Megatron). On by default; same bits on and off with --deterministic; coc bench train "
                "--baseline may switch it")
      ->capture_default_str();
  cmd->add_flag("--overlap-forward-micro-batches,!--no-overlap-forward-micro-batches", c.overlap_forward_micro_batches,
                "Run the forwards of micro-batches 2j and 2j+1 interleaved, layer by layer, so that each one's "
                "attention and SwiGLU compute while the other's tensor-parallel transfers are in flight; then each "
                "micro-batch's loss and backward in order (coc's own, beyond Megatron). Needs two or more "
                "micro-batches per iteration (--global-batch-size at least twice --micro-batch-size × the "
                "data-parallel size) and keeps two "
                "micro-batches' activations; not with pipeline or context parallelism, MoE, recomputation or a "
                "sharded strategy. Off by default; same bits on and off; coc bench train --baseline may switch it")
      ->capture_default_str();
  cmd->add_option("--comm-engine", o.engine,
                  "Progress engine: 'inline' (poll between GEMM chunks) or 'thread' (sleeping comm thread)")
      ->capture_default_str();
  cmd->add_option("--comm-poll-us", o.poll_us, "Threaded engine: sleep between MPI tests (µs)")->capture_default_str();
  cmd->add_option("--comm-nonblocking-impl", o.nonblocking_impl,
                  "How the non-blocking reduce-scatter and all-gather are built (a coc option): 'p2p' (MPI_Isend/"
                  "MPI_Irecv to every peer, summed in rank order) or 'mpi' (MPI_Ireduce_scatter, MPI_Iallgatherv; "
                  "Open MPI's reduce-scatter runs at a third of link speed over TCP)")
      ->capture_default_str();
  cmd->add_option("--distributed-timeout-minutes", o.timeout_minutes,
                  "Abort with the stuck op's name if a collective takes longer than this")->capture_default_str();
  cmd->add_flag("--debug-collectives", o.debug_collectives,
                "Check every collective's fingerprint across ranks before running it (names the first mismatch "
                "instead of hanging)");
  // Model.
  cmd->add_option("--model-preset", o.model_preset, "Model shapes: 'tiny', 'tiny-moe' (tiny with 4 experts, top-2) "
                                                    "or 'llama2-7b-layer'")
      ->capture_default_str();
  cmd->add_option("--num-layers", o.num_layers, "Decoder layers (default: from the preset)");
  cmd->add_option("--hidden-size", o.hidden_size, "Hidden size H (default: from the preset)");
  cmd->add_option("--num-attention-heads", o.num_attention_heads, "Attention heads (default: from the preset)");
  cmd->add_option("--ffn-hidden-size", o.ffn_hidden_size, "SwiGLU inner width F (default: from the preset)");
  cmd->add_option("--seq-length", o.seq_length, "Sequence length S in bytes (default: from the preset)");
  cmd->add_option("--norm-epsilon", o.norm_epsilon, "RMSNorm epsilon (default: from the preset, 1e-5)");
  cmd->add_option("--rotary-base", o.rotary_base, "RoPE base theta (default: from the preset, 10000)");
  cmd->add_option("--init-method-std", o.init_method_std,
                  "Standard deviation of the normal initialisation of the weights (default: from the preset, 0.02)");
  // Batch and schedule.
  cmd->add_option("--micro-batch-size", c.micro_batch_size, "Sequences per micro-batch")->capture_default_str();
  cmd->add_option("--global-batch-size", o.global_batch_size,
                  "Sequences per iteration over all data-parallel ranks (micro-batches accumulate); 0 = auto: the "
                  "smallest multiple of micro-batch × dp that is >= 16")
      ->capture_default_str();
  cmd->add_option("--train-iters", c.train_iters, "Iterations to train")->capture_default_str();
  cmd->add_option("--log-interval", c.log_interval,
                  "Print every N iterations (with --log-json or --tensorboard-dir, the same on every rank)")
      ->capture_default_str();
  add_schedule_flags(cmd, o);
  cmd->add_option("--clip-grad", c.optim.clip_grad, "Max global gradient norm (0: no clipping)")->capture_default_str();
  cmd->add_option("--weight-decay", c.optim.weight_decay, "AdamW decoupled weight decay")->capture_default_str();
  cmd->add_option("--adam-beta1", c.optim.beta1, "AdamW beta1")->capture_default_str();
  cmd->add_option("--adam-beta2", c.optim.beta2, "AdamW beta2")->capture_default_str();
  cmd->add_option("--adam-eps", c.optim.eps, "AdamW epsilon, added to the root of the second moment")
      ->capture_default_str();
  // A uint64_t option would wrap '-1' and saturate values past 2^64 - 1 into seeds nobody asked for.
  cmd->add_option("--seed", c.seed, "Seed of initialisation, data order and sampling (0 .. 2^64 - 1)")
      ->check([](const std::string& v) {
        uint64_t x = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
        return ec == std::errc() && end == v.data() + v.size() && !v.empty()
                   ? std::string()
                   : fmt::format("must be an integer from 0 to 18446744073709551615 (got '{}')", v);
      })
      ->capture_default_str();
  // Data and checkpoints.
  // Megatron's --data-path takes several words (a blend "0.3 A 0.7 B"): join them as TrainingData reads them.
  cmd->add_option_function<std::vector<std::string>>(
         "--data-path",
         [&c](const std::vector<std::string>& words) {
           c.data_path.clear();
           for (const std::string& w : words) c.data_path += (c.data_path.empty() ? "" : " ") + w;
         },
         "Text file or folder, preprocessed prefix (PREFIX.bin/.idx) or weighted blend 'W1 P1 W2 P2 ...' to train on "
         "(default: Debian's fortunes, /usr/share/games/fortunes)")
      ->expected(1, CLI::detail::expected_max_vector_size)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--save", c.save,
                  "Directory to write checkpoints to (sharded per rank, atomic; the same path on every rank, on a "
                  "shared file system across nodes)");
  cmd->add_option("--load", c.load,
                  "Directory to resume from (its latest_checkpointed_iteration.txt; the same path on every rank)");
  cmd->add_option("--save-interval", c.save_interval, "Save every N iterations (0: only at the end)")
      ->capture_default_str();
  cmd->add_flag("--no-load-optim", o.no_load_optim,
                "With --load: load the weights and the iteration, but start AdamW's moments and the learning-rate "
                "schedule afresh (Megatron's)");
  cmd->add_flag("--finetune", c.finetune,
                "With --load: load the weights only, and train from iteration 0 with a fresh optimizer (Megatron's)");
  cmd->add_option("--exit-interval", c.exit_interval,
                  "Stop after the first iteration that is a multiple of N, after saving a checkpoint when --save is "
                  "given (Megatron's; 0: train to --train-iters)")
      ->check(non_negative_integer());
  cmd->add_option("--exit-duration-in-mins", c.exit_duration_mins,
                  "Stop after the first iteration that ends more than M minutes after training began, after saving a "
                  "checkpoint when --save is given (Megatron's; 0: no limit)");
  cmd->add_flag("--exit-on-missing-checkpoint", c.exit_on_missing_checkpoint,
                "With --load: a folder without a checkpoint is an error, not a start from scratch (Megatron's)");
  // Output.
  cmd->add_option("--sample-length", c.sample_length, "Bytes of text to generate at the end (0: none)")
      ->capture_default_str();
  cmd->add_option("--sample-prompt", c.sample_prompt, "Prompt for the generated sample")->capture_default_str();
  cmd->add_option("--sample-temperature", c.sample_temperature, "Sampling temperature")->capture_default_str();
  // Pipeline parallelism: 1F1B, plain or interleaved, over the pp stages (model/pipeline_schedule.h,
  // docs/pipeline.md).
  cmd->add_option("--pipeline-model-parallel-size,--pp", c.pipeline_model_parallel_size,
                  "Pipeline-parallel size P: the layers split into P stages of contiguous layers (embedding on the "
                  "first, head and loss on the last), run by the 1F1B schedule over the micro-batches (interleaved "
                  "with --num-virtual-stages-per-pipeline-rank; world = tp × cp × pp × dp). A checkpoint loads at "
                  "another P or layer split (not a MoE one with ep > 1). Composes with cp (ring attention inside each "
                  "stage), sharded data parallelism, MoE and recomputation (--recompute-num-layers counts one stage's "
                  "layers, one virtual stage's with --num-virtual-stages-per-pipeline-rank)")
      ->capture_default_str();
  cmd->add_option("--decoder-first-pipeline-num-layers", c.pipeline_split.first_stage_layers,
                  "Pipeline: the layers of the first stage (the others split the rest evenly); default: even split");
  cmd->add_option("--decoder-last-pipeline-num-layers", c.pipeline_split.last_stage_layers,
                  "Pipeline: the layers of the last stage (the others split the rest evenly); default: even split");
  // Off by default, unlike Megatron (whose --no-overlap-p2p-communication turns it off, and is accepted here): coc's
  // stage sends never block, and posting the receives early only added polls, 3% slower on the shaped cluster
  // (docs/performance.md, point 39).
  cmd->add_flag("--overlap-p2p-communication,!--no-overlap-p2p-communication", c.overlap_p2p_communication,
                "Pipeline: post the receive of the next micro-batch's activation (gradient) before the current one "
                "computes, so the stage transfer lands meanwhile (the same bits; coc bench train --baseline can "
                "switch it). Default off (Megatron's is on): measured 3% slower here");
  cmd->add_option("--num-virtual-stages-per-pipeline-rank,--virtual-pipeline-model-parallel-size", o.virtual_stages,
                  "Pipeline: V model chunks per rank, run by the interleaved 1F1B schedule (rank s holds virtual "
                  "stages s, P + s, ...; bubble (P-1)/(V·M+P-1)). Needs the micro-batches per iteration to be a "
                  "multiple of P and the layers of P·V; default 1")
      ->check(integer_at_least(1));
  cmd->add_option("--num-layers-per-virtual-pipeline-stage", o.layers_per_virtual_stage,
                  "Pipeline: N layers per virtual stage, i.e. --num-virtual-stages-per-pipeline-rank "
                  "layers / (P·N) (Megatron's older flag)")
      ->check(integer_at_least(1));
  // Context parallelism: ring attention over the cp group (parallel/ring_attention.h, docs/semantics.md §5).
  cmd->add_option("--context-parallel-size,--cp", c.context_parallel_size,
                  "Context-parallel size CP: the sequence is split into 2·CP zig-zag chunks over CP ranks, attention "
                  "runs as a ring (world = tp × cp × pp × dp; under pipelining each stage has its own ring)")
      ->capture_default_str();
  cmd->add_option("--context-parallel-algo", o.context_parallel_algo, "Context-parallel algorithm (ring attention)")
      ->check(CLI::IsMember({"megatron_cp_algo"}))
      ->capture_default_str();
  cmd->add_flag("--use-cp-send-recv-overlap", c.cp_send_recv_overlap,
                "Ring attention: send and receive on two communicators (full duplex)");
  cmd->add_option("--cp-window-size", c.cp_window_size,
                  "Ring attention: double-ring window w (divides CP; 1: the plain ring)")
      ->capture_default_str();
  cmd->add_option("--attention-mask-type", o.attention_mask_type,
                  "causal, or general (every position visible; runs attention through the ring)")
      ->check(CLI::IsMember({"causal", "general"}))
      ->capture_default_str();
  // Sharded data parallelism (parallel/fsdp.h, docs/semantics.md §4; Megatron-FSDP's and MindSpeed's FSDP2 flags).
  cmd->add_option_function<std::string>(
         "--data-parallel-sharding-strategy",
         [&c](const std::string& v) { c.data_parallel_sharding_strategy = parse_sharding_strategy(v); },
         "Shard over each parameter's data-parallel replicas: no_shard (all-reduce), optim (ZeRO-1: AdamW state and "
         "update), optim_grads (ZeRO-2: and gradients), optim_grads_params (ZeRO-3/FSDP: and parameters, gathered "
         "per module and freed after use)")
      ->default_str("no_shard");
  cmd->add_flag("--overlap-grad-reduce,!--no-overlap-grad-reduce", c.overlap_grad_reduce,
                "no_shard: post each module's data-parallel gradient all-reduce when its backward ends (last "
                "micro-batch), overlapping the rest of the backward (Megatron's flag; the sharded strategies always "
                "do so with their reduce-scatters). On by default in coc (Megatron: off), as every overlap that keeps "
                "the bits; --no-overlap-grad-reduce reduces after the backward");
  cmd->add_option("--num-to-forward-prefetch", c.num_to_forward_prefetch,
                  "optim_grads_params: parameter all-gathers of the next F modules in flight during a module's "
                  "forward (0: gather on demand; beyond the remaining modules it is clamped)")
      ->capture_default_str();
  cmd->add_option("--num-to-backward-prefetch", c.num_to_backward_prefetch,
                  "optim_grads_params: the same for the backward, B modules ahead in reverse order")
      ->capture_default_str();
  // Activation recomputation (model/transformer_layer.h; Megatron's flags and rules; resolve_recompute).
  cmd->add_option("--recompute-granularity", o.recompute.granularity,
                  "Trade compute for activation memory: full (a recomputed layer keeps only its chunk's input and "
                  "runs its forward again in backward; needs --recompute-method and --recompute-num-layers) or "
                  "selective (only the attention probabilities, which grow with the sequence length squared); none "
                  "turns it off (coc's, for bench train --baseline). The same results either way")
      ->default_str("none");
  cmd->add_option("--recompute-method", o.recompute.method,
                  "full: uniform (the layers in chunks of --recompute-num-layers, each recomputed from its input) or "
                  "block (the first --recompute-num-layers layers, each on its own; the rest keep their "
                  "activations)");
  cmd->add_option("--recompute-num-layers", o.recompute.num_layers,
                  "full: layers per chunk (uniform) or recomputed layers (block), from 1 to --num-layers; under "
                  "pipelining they count the layers of one stage (of one virtual stage with "
                  "--num-virtual-stages-per-pipeline-rank; Megatron's rule)");
  cmd->add_flag("--recompute-activations", o.recompute.activations,
                "Megatron's older spelling of --recompute-granularity selective");
  cmd->add_flag("--no-progress", o.no_progress, "No progress bar, even on a terminal");
  add_moe_flags(cmd, o.moe);
  add_mindspeed_flags(cmd, o);  // --use-ascend-coc, --coc-mode, --use-ascend-mc2, NPU kernel flags
  add_megatron_flags(cmd, o.megatron);  // Megatron's script flags: restating, mapped, refused
  add_precision_flags(cmd, o.precision);  // --bf16, --fp16 (refused for now) and loss scaling
  add_data_flags(cmd, o);
  cmd->add_flag("-v,--verbose", o.verbose,
                "-v: each CoC op's schedule and why, and each rank's GEMM and communication-wait time per "
                "iteration; -vv: also every collective posted");
}

TrainConfig TrainOptions::resolve(bool stdout_is_tty) const {
  check_precision_flags(precision);
  TrainConfig c = cfg;
  c.bf16 = precision.bf16;
  c.fp16 = precision.fp16;
  c.grad_reduce_in_bf16 = precision.grad_reduce_in_bf16;
  if (c.fp16) c.loss_scale = loss_scale_config(precision);
  c.model = coc::model_preset(model_preset);
  if (model_preset == "llama2-7b-layer") {
    // Benchmark preset: few steps and a learning rate that suits its width (the tiny preset's 3e-3 diverges).
    if (c.train_iters == 300) c.train_iters = 10;
    if (c.optim.lr == 3e-3f) c.optim.lr = 3e-4f;
    if (c.optim.min_lr > c.optim.lr) c.optim.min_lr = c.optim.lr / 10;
    if (c.sample_length == TrainConfig{}.sample_length) c.sample_length = 0;
  }
  if (num_layers != kFromPreset) c.model.num_layers = num_layers;
  if (hidden_size != kFromPreset) c.model.hidden_size = hidden_size;
  if (num_attention_heads != kFromPreset) c.model.num_attention_heads = num_attention_heads;
  if (ffn_hidden_size != kFromPreset) c.model.ffn_hidden_size = ffn_hidden_size;
  if (seq_length != kFromPreset) c.model.seq_length = seq_length;
  if (!std::isnan(norm_epsilon)) c.model.norm_epsilon = norm_epsilon;
  if (!std::isnan(rotary_base)) c.model.rotary_base = rotary_base;
  c.norm_epsilon_given = !std::isnan(norm_epsilon);
  c.rotary_base_given = !std::isnan(rotary_base);
  if (!std::isnan(init_method_std)) c.model.init_method_std = init_method_std;
  c.model.fp32_residual_connection = precision.fp32_residual_connection;
  apply_mindspeed_flags(mindspeed, c);
  if (group_query_attention)
    c.model.num_query_groups = num_query_groups;
  else if (num_query_groups != 1)
    log::warn("--num-query-groups {} has no effect without --group-query-attention (Megatron's rule): every query "
              "head keeps its own key/value head; add --group-query-attention to share them",
              num_query_groups);
  if (moe.num_experts != MoeOptions::kNotGiven) c.model.num_experts = moe.num_experts;
  if (moe.topk != MoeOptions::kNotGiven) c.model.moe_router_topk = moe.topk;
  if (moe.ffn_hidden != MoeOptions::kNotGiven) c.model.moe_ffn_hidden_size = moe.ffn_hidden;
  if (moe.layer_freq != MoeOptions::kNotGiven) c.model.moe_layer_freq = moe.layer_freq;
  if (moe.first_k_dense != MoeOptions::kNotGiven) c.model.moe_first_k_dense = moe.first_k_dense;
  c.expert_model_parallel_size = moe.ep;
  c.moe = moe.settings(c.deterministic);
  if (!gemm_backend.empty()) c.gemm_backend = parse_gemm_backend(gemm_backend);
  resolve_tokenizer_name(megatron.tokenizer_name_or_path, c);
  apply_megatron_flags(megatron, c);
  int world = 1;
  world = world_size();
  if (tp == 0 && c.model.is_moe()) {
    c.tensor_model_parallel_size = 1;
  } else if (tp == 0) {
    // Auto: the largest tp that divides the world and the model's head count and FFN width, so that the built-in
    // default runs on any rank count (2 ranks: tp 2; 3 ranks: tp 1 × dp 3; 4 ranks: tp 2 × dp 2).
    int best = 1;
    for (int t = 1; t <= world; ++t)
      if (world % (t * std::max(1, c.context_parallel_size) * std::max(1, c.pipeline_model_parallel_size)) == 0 &&
          c.model.num_attention_heads % t == 0 &&
          c.model.kv_heads() % t == 0 &&
          c.model.ffn_hidden_size % t == 0)
        best = t;
    c.tensor_model_parallel_size = best;
  } else {
    c.tensor_model_parallel_size = tp;
  }
  if (global_batch_size == 0) {
    const int64_t step =
        c.micro_batch_size *
        std::max(1, world / std::max(1, c.tensor_model_parallel_size * std::max(1, c.context_parallel_size) *
                                            std::max(1, c.pipeline_model_parallel_size)));
    c.global_batch_size = step > 0 ? (16 + step - 1) / step * step : 16;
  } else {
    c.global_batch_size = global_batch_size;
  }
  resolve_schedule(c);
  resolve_recompute(c);
  resolve_virtual_stages(c);
  c.progress_bar = stdout_is_tty && !no_progress;
  c.attention_mask = attention_mask_type == "general" ? AttnMask::kFull : AttnMask::kCausal;
  return c;
}

void TrainOptions::resolve_virtual_stages(TrainConfig& c) const {
  const int P = c.pipeline_model_parallel_size, L = static_cast<int>(c.model.num_layers);
  const int N = layers_per_virtual_stage;
  if (virtual_stages != 0 && N != 0)
    throw_invalid("--num-layers-per-virtual-pipeline-stage {} and --num-virtual-stages-per-pipeline-rank {} are "
                  "mutually exclusive (Megatron's rule); pass one",
                  N, virtual_stages);
  if (N == 0) {
    c.pipeline_split.virtual_stages = virtual_stages == 0 ? 1 : virtual_stages;
    return;
  }
  if (N < 1) throw_invalid("--num-layers-per-virtual-pipeline-stage must be >= 1 (got {})", N);
  if (P < 2)
    throw_invalid("--num-layers-per-virtual-pipeline-stage {} (the interleaved schedule) needs "
                  "--pipeline-model-parallel-size > 1; drop it or add pipeline stages",
                  N);
  if (L % (P * N) != 0)
    throw_invalid("--num-layers {} is not divisible by --pipeline-model-parallel-size {} × "
                  "--num-layers-per-virtual-pipeline-stage {} = {}; pass layers per virtual stage that divide {}",
                  L, P, N, P * N, L / P);
  c.pipeline_split.virtual_stages = L / (P * N);
}

void TrainOptions::resolve_recompute(TrainConfig& c) const {
  std::string g = recompute.granularity;
  if (recompute.activations) {
    if (!g.empty() && g != "selective")
      throw_invalid("--recompute-activations means --recompute-granularity selective (Megatron's older spelling), "
                    "which contradicts --recompute-granularity {}; give one of them",
                    g);
    g = "selective";
  }
  if (g.empty()) {
    if (!recompute.method.empty() || recompute.num_layers)
      throw_invalid("--recompute-method / --recompute-num-layers without --recompute-granularity: add "
                    "--recompute-granularity full (they apply to full recomputation only)");
    return;
  }
  c.recompute = {};
  c.recompute.granularity = parse_recompute_granularity(g);
  if (c.recompute.granularity == RecomputeGranularity::kNone) return;
  if (!recompute.method.empty()) c.recompute.method = parse_recompute_method(recompute.method);
  c.recompute.num_layers = recompute.num_layers;
}

void TrainOptions::resolve_schedule(TrainConfig& c) const {
  OptimizerConfig& op = c.optim;
  op.decay_style = parse_lr_decay_style(lr_decay_style);
  op.wsd_style = parse_wsd_decay_style(lr_wsd_decay_style);
  const auto given = [&](const char* flag) { return megatron.app && megatron.app->get_option(flag)->count() > 0; };
  // Megatron: iteration- or sample-based, never both; its scheduler counts samples, so a sample count divided by the
  // fixed global batch is the same schedule in iterations (unrounded).
  if (train_samples >= 0 && given("--train-iters"))
    throw_invalid("--train-samples {} and --train-iters {}: pass only one of them (as Megatron asks)", train_samples,
                  c.train_iters);
  if (train_samples >= 0) c.train_iters = train_samples / c.global_batch_size;
  const int warmups = (lr_warmup_fraction >= 0) + (lr_warmup_iters > 0) + (lr_warmup_samples >= 0);
  if (warmups > 1)
    throw_invalid("--lr-warmup-fraction, --lr-warmup-iters and --lr-warmup-samples: pass only one of them (as "
                  "Megatron asks)");
  if (lr_decay_samples >= 0 && lr_decay_iters >= 0)
    throw_invalid("--lr-decay-samples {} and --lr-decay-iters {}: pass only one of them", lr_decay_samples,
                  lr_decay_iters);
  const double gbs = static_cast<double>(c.global_batch_size);
  const int64_t default_warmup = warmups > 0 ? 0 : c.train_iters / 10;
  const int64_t warmup = lr_warmup_iters >= 0 ? lr_warmup_iters : default_warmup;
  if (lr_decay_iters >= 0) op.decay_iters = static_cast<double>(lr_decay_iters);
  else if (lr_decay_samples >= 0) op.decay_iters = static_cast<double>(lr_decay_samples) / gbs;
  else if (train_samples >= 0) op.decay_iters = static_cast<double>(train_samples) / gbs;
  else op.decay_iters = static_cast<double>(std::max(c.train_iters, warmup));
  // Megatron: lr_warmup_steps = lr_warmup_fraction × lr_decay_steps, not rounded.
  if (lr_warmup_fraction >= 0) op.warmup_iters = lr_warmup_fraction * op.decay_iters;
  else if (lr_warmup_samples >= 0) op.warmup_iters = static_cast<double>(lr_warmup_samples) / gbs;
  else op.warmup_iters = static_cast<double>(warmup);
  c.load_optim = !no_load_optim;
}

CommOptions TrainOptions::comm_options() const {
  CommOptions o;
  o.engine = parse_engine_kind(engine);
  o.nonblocking = parse_nonblocking_impl(nonblocking_impl);
  o.poll_us = poll_us;
  if (!(timeout_minutes > 0))
    throw_invalid("--distributed-timeout-minutes must be > 0 (got {})", timeout_minutes);
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_minutes * 60000.0));
  o.check_fingerprints = debug_collectives;
  return o;
}

}  // namespace coc::cli
