// The `coc train` flags (Megatron/MindSpeed names), shared by `coc train` and `coc check --train-steps`, and the
// YAML config file reader (`--config FILE`; keys are the flag names without the leading dashes; flags given on
// the command line override the file).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "coc/comm/communicator.h"
#include "coc/model/trainer.h"

namespace coc::cli {

/// Flag values as parsed; model-shape fields are -1 until given, so that --model-preset supplies them.
struct TrainOptions {
  TrainConfig cfg;
  std::string model_preset = "tiny";
  int64_t num_layers = -1, hidden_size = -1, num_attention_heads = -1, ffn_hidden_size = -1, seq_length = -1;
  int tp = 0;  ///< 0: the whole world (the built-in default)
  std::string engine = "inline";
  int poll_us = 100;
  double timeout_minutes = 5.0;
  bool debug_collectives = false;
  bool no_progress = false;
  int verbose = 0;
  int64_t lr_decay_iters = -1, lr_warmup_iters = -1;
  std::string config_path;  ///< --config

  /// Applies the preset and the flags given; resolves tp = 0 to the world size. Throws uniform kInvalidArgument.
  TrainConfig resolve(bool stdout_is_tty) const;
  CommOptions comm_options() const;
};

/// Registers every training flag on `cmd`, plus --config (YAML).
void add_train_flags(CLI::App* cmd, TrainOptions& o);

/// Applies the YAML file named by --config to `cmd` after parsing: each key is a flag name without the dashes
/// (`lr: 0.003`, `sequence-parallel: true`, `tensor-model-parallel-size: 2`); flags given on the command line win.
/// Throws a uniform kInvalidArgument error for unreadable YAML, a non-map document or an unknown key.
void apply_yaml_config(CLI::App* cmd, const std::string& path);

}  // namespace coc::cli
