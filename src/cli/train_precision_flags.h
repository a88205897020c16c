// Megatron's precision flags (docs/mixed-precision.md): --bf16 and --fp16 (fp32 master weights; the GEMMs and the
// stored activations in 16 bits), --fp32-residual-connection, and --fp16's loss scaling. The combinations that have
// no meaning are refused: --bf16 with --fp16, and a loss-scaling flag without --fp16 (bf16 and fp32 need no loss
// scaling), except --initial-loss-scale, which Megatron's bf16 scripts pass and Megatron ignores without --fp16.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "coc/model/loss_scaler.h"

namespace coc::cli {

struct PrecisionFlags {
  bool bf16 = false, fp16 = false;
  bool fp32_residual_connection = false;  ///< --fp32-residual-connection (with --bf16)
  bool grad_reduce_in_bf16 = false;  ///< --grad-reduce-in-bf16: the data-parallel reduction in 16 bits
  /// The loss-scaling flags given (--loss-scale, --min-loss-scale, --loss-scale-window, --hysteresis) with their
  /// values, in registration order.
  std::vector<std::pair<const CLI::Option*, std::string>> loss_scaling;
};

/// Registers --bf16 (and coc's --no-bf16, which turns it off for a --baseline), --fp16,
/// --fp32-residual-connection, --grad-reduce-in-bf16 and the loss-scaling flags on `cmd`.
void add_precision_flags(CLI::App* cmd, PrecisionFlags& p);

/// Throws one uniform kInvalidArgument line for: --bf16 with --fp16; a loss-scaling flag (named with its value)
/// without --fp16; --grad-reduce-in-bf16 without --bf16, or at all (not built); --fp32-residual-connection without
/// a 16-bit type.
void check_precision_flags(const PrecisionFlags& p);

/// The loss-scaling flags given, over Megatron's defaults, validated (LossScaleConfig::validate); a value that is
/// not a number is one kInvalidArgument line naming the flag.
LossScaleConfig loss_scale_config(const PrecisionFlags& p);

}  // namespace coc::cli
