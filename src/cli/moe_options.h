// The MoE flags (Megatron's names): one block shared by the commands that build a MoE layer (`coc check --layer
// moe`; `coc train` once the decoder takes MoE layers).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "coc/parallel/moe.h"

namespace coc::cli {

struct MoeOptions {
  int num_experts = 4;              ///< --num-experts
  int topk = 2;                     ///< --moe-router-topk
  int ep = 1;                       ///< --expert-model-parallel-size
  double capacity_factor = 0;       ///< --moe-expert-capacity-factor (0: no dropping)
  double aux_loss_coeff = 0.01;     ///< --moe-aux-loss-coeff
  std::string dispatcher = "eager";  ///< --ep-dispatcher
  int mc2_chunks = 2;               ///< --moe-mc2-chunks
  std::string fixed_router = "none";  ///< --moe-fixed-router
  CLI::Option* capacity_opt = nullptr;
  std::vector<CLI::Option*> all;  ///< every MoE flag, for given()

  /// The first MoE flag given on the command line ("--num-experts"), or "" when none was.
  std::string given() const;

  /// The MoeConfig of these flags for sizes H and F. Throws a uniform kInvalidArgument error for a capacity factor
  /// <= 0 given on the command line, an unknown dispatcher or router pattern, and check_moe_config's errors.
  MoeConfig config(int64_t hidden, int64_t ffn_hidden, bool deterministic) const;
};

/// Registers the MoE flags on `cmd` (group "Mixture of experts").
void add_moe_flags(CLI::App* cmd, MoeOptions& o);

}  // namespace coc::cli
