// Megatron's precision flags: --bf16 (trained: fp32 master weights, GEMMs and the stored activations in bf16;
// docs/mixed-precision.md), --fp32-residual-connection, and --fp16 with its loss scaling (refused with what to do:
// fp16 needs dynamic loss scaling, not built yet). The combinations that have no meaning are refused first: --bf16
// with --fp16, and a loss-scaling flag without --fp16 (bf16 and fp32 need no loss scaling). Megatron's
// --initial-loss-scale, which its bf16 scripts pass and ignore, is a restating flag (train_megatron_flags.cpp).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

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
/// without --fp16; --grad-reduce-in-bf16 or --fp32-residual-connection without --bf16; --grad-reduce-in-bf16 (not
/// built); --fp16 (not built).
void check_precision_flags(const PrecisionFlags& p);

}  // namespace coc::cli
