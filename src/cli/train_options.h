// The `coc train` flags (Megatron/MindSpeed names), shared by `coc train` and `coc check --train-steps`, and the
// YAML config file reader (`--config FILE`; keys are the flag names without the leading dashes; flags given on
// the command line override the file).
#pragma once

#include <CLI/CLI.hpp>

#include <limits>
#include <optional>
#include <string>

#include "cli/moe_options.h"
#include "cli/train_megatron_flags.h"
#include "cli/train_precision_flags.h"
#include "cli/train_mindspeed_flags.h"
#include "coc/comm/communicator.h"
#include "coc/model/trainer.h"

namespace coc::cli {

/// "Not given on the command line or in the config": --model-preset supplies the value.
inline constexpr int64_t kFromPreset = std::numeric_limits<int64_t>::min();

/// Flag values as parsed; model-shape fields are kFromPreset until given.
struct TrainOptions {
  TrainConfig cfg;
  std::string model_preset = "tiny";
  int64_t num_layers = kFromPreset, hidden_size = kFromPreset, num_attention_heads = kFromPreset,
          ffn_hidden_size = kFromPreset, seq_length = kFromPreset;
  int tp = 0;  ///< 0: auto, the largest size that divides the world, the heads and the FFN width
  std::string engine = "inline";
  std::string nonblocking_impl = "p2p";
  int poll_us = 100;
  double timeout_minutes = 5.0;
  bool debug_collectives = false;
  std::string gemm_backend;  ///< --gemm-backend; empty: COC_GEMM_BACKEND's choice
  bool no_progress = false;
  int verbose = 0;
  int64_t lr_decay_iters = -1, lr_warmup_iters = -1;
  double lr_warmup_fraction = -1;  ///< --lr-warmup-fraction (< 0: not given)
  /// Megatron's sample counts (< 0: not given): --train-samples, --lr-decay-samples, --lr-warmup-samples
  int64_t train_samples = -1, lr_decay_samples = -1, lr_warmup_samples = -1;
  std::string lr_decay_style = "cosine", lr_wsd_decay_style = "exponential";
  bool no_load_optim = false;
  std::string config_path;  ///< --config
  int64_t global_batch_size = 0;  ///< 0: auto (>= 16, a multiple of micro-batch × dp)
  /// --norm-epsilon, --rotary-base, --init-method-std; NaN: the preset's
  float norm_epsilon = std::numeric_limits<float>::quiet_NaN(), rotary_base = std::numeric_limits<float>::quiet_NaN(),
        init_method_std = std::numeric_limits<float>::quiet_NaN();
  MindSpeedFlags mindspeed;  ///< train_mindspeed_flags.h
  MegatronFlags megatron;    ///< train_megatron_flags.h
  PrecisionFlags precision;  ///< train_precision_flags.h
  // Real models and data (add_data_flags): grouped-query attention.
  bool group_query_attention = false;
  int64_t num_query_groups = 1;
  // Context parallelism (MindSpeed's flags; cfg holds the size, the overlap switch and the window).
  std::string context_parallel_algo = "megatron_cp_algo";  ///< --context-parallel-algo (ring attention, the only one)
  std::string attention_mask_type = "causal";             ///< --attention-mask-type causal|general
  MoeOptions moe;  ///< mixture of experts (moe_options.h)
  /// The interleaved schedule as given (resolve_virtual_stages turns it into pipeline_split.virtual_stages); 0: not
  /// given. --num-virtual-stages-per-pipeline-rank (alias --virtual-pipeline-model-parallel-size) and
  /// --num-layers-per-virtual-pipeline-stage.
  int virtual_stages = 0, layers_per_virtual_stage = 0;
  /// Activation recomputation as given (resolve_recompute turns it into TrainConfig::recompute): empty strings and
  /// nullopt are flags not given.
  struct Recompute {
    std::string granularity;         ///< --recompute-granularity full|selective|none
    std::string method;              ///< --recompute-method uniform|block
    std::optional<int> num_layers;   ///< --recompute-num-layers
    bool activations = false;        ///< --recompute-activations (Megatron's older spelling of selective)
  } recompute;

  /// Applies the preset and the flags given; resolves tp = 0 to the world size (to 1 for a MoE model, whose experts
  /// spread over the data-parallel ranks). Throws uniform kInvalidArgument.
  TrainConfig resolve(bool stdout_is_tty) const;
  CommOptions comm_options() const;
  /// The learning-rate schedule flags into c.optim (Megatron's rules: --lr-warmup-fraction × --lr-decay-iters,
  /// --lr-decay-iters defaulting to --train-iters) and the checkpoint-loading switches.
  void resolve_schedule(TrainConfig& c) const;
  /// Megatron's rules over the recompute flags (the granularity's own checks are RecomputeConfig::validate's):
  /// --recompute-activations against another granularity, and a method or count without a granularity, are one
  /// kInvalidArgument line each. An explicit `none` (coc's, so that `bench train --baseline` can turn it off) drops
  /// the method and count.
  void resolve_recompute(TrainConfig& c) const;
  /// Megatron's rules for the virtual stages: --num-layers-per-virtual-pipeline-stage N gives V = layers / (P·N)
  /// (it and --num-virtual-stages-per-pipeline-rank exclude each other; N needs P > 1 and P·N dividing the layers).
  /// One kInvalidArgument line each; pipeline_virtual_stage_layers checks V itself later.
  void resolve_virtual_stages(TrainConfig& c) const;
};

/// Registers every training flag on `cmd`, plus --config (YAML).
void add_train_flags(CLI::App* cmd, TrainOptions& o);

/// Applies the YAML file named by --config to `cmd` after parsing: each key is a flag name without the dashes
/// (`lr: 0.003`, `sequence-parallel: true`, `tensor-model-parallel-size: 2`); flags given on the command line win.
/// Throws a uniform kInvalidArgument error for unreadable YAML, a non-map document or an unknown key.
void apply_yaml_config(CLI::App* cmd, const std::string& path);

}  // namespace coc::cli
