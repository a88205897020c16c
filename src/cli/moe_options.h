// The MoE flags (Megatron's names; --ep-dispatcher and --moe-mc2-chunks are MindSpeed-LLM's): one block, part of
// the training flags (train_options.h), so `coc train`, `coc bench train` and `coc check` (--layer moe and
// --train-steps) take the same spellings.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "coc/parallel/moe.h"

namespace coc::cli {

/// Shape flags are kNotGiven until given (values, not option pointers, so that a copy parsed by another parser,
/// such as `coc bench train --baseline`'s, resolves alike).
struct MoeOptions {
  static constexpr int kNotGiven = -1;
  int num_experts = kNotGiven;       ///< --num-experts (coc train: the model preset's; --layer moe: 4)
  int topk = kNotGiven;              ///< --moe-router-topk (coc train: the model preset's; --layer moe: 2)
  int64_t ffn_hidden = kNotGiven;    ///< --moe-ffn-hidden-size (coc train: the preset's; --layer moe: --n)
  int64_t layer_freq = kNotGiven;    ///< --moe-layer-freq (coc train only; default 1)
  int64_t first_k_dense = kNotGiven; ///< --first-k-dense-replace (coc train only; default 0)
  int ep = 1;                       ///< --expert-model-parallel-size
  double capacity_factor = 0;       ///< --moe-expert-capacity-factor (0: no dropping)
  double aux_loss_coeff = 0.01;     ///< --moe-aux-loss-coeff
  /// --ep-dispatcher. mc2 by default (coc's default; MindSpeed-LLM's dispatchers are opt-in): it keeps the bits of
  /// eager under --deterministic and measured 1.29-1.35x faster on the shaped cluster and 1.06-1.18x on one node
  /// at ep 2 (docs/performance.md, point 39); at ep 1 there is nothing to exchange and it costs nothing measurable.
  std::string dispatcher = "mc2";
  int mc2_chunks = 2;               ///< --moe-mc2-chunks
  std::string fixed_router = "none";  ///< --moe-fixed-router
  CLI::Option* capacity_opt = nullptr;
  std::vector<CLI::Option*> all;  ///< every MoE flag, for given()

  /// The first MoE flag given on the command line ("--num-experts"), or "" when none was.
  std::string given() const;

  /// The run settings of these flags (capacity factor, aux loss coefficient, dispatcher, mc2 chunks, fixed router;
  /// shapes left 0). Throws a uniform kInvalidArgument error for a capacity factor <= 0 given on the command line
  /// or in a config file, a negative aux loss coefficient, an unknown dispatcher or router pattern, ep < 1.
  MoeConfig settings(bool deterministic) const;
  /// settings() with the shapes H, F, E and K, checked against ep (check_moe_config's errors too).
  MoeConfig config(int64_t hidden, int64_t ffn_hidden, bool deterministic) const;
};

/// Registers the MoE flags on `cmd` (group "Mixture of experts").
void add_moe_flags(CLI::App* cmd, MoeOptions& o);

}  // namespace coc::cli
