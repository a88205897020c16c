// Megatron's precision flags (--bf16, --fp16 and the loss scaling of --fp16), registered so that a script that
// passes them gets a reason instead of CLI11's "argument was not expected". Mixed-precision training is being built
// (issue 35): the bf16 GEMMs and the 16-bit collectives exist (coc/kernels/gemm.h, docs/semantics.md §9), the
// 16-bit layers do not yet, so --bf16 and --fp16 are refused with what to do. The combinations that have no meaning
// are refused first, as they will be once the flags train: --bf16 with --fp16, and a loss-scaling flag without
// --fp16 (bf16 and fp32 need no loss scaling). Megatron's --initial-loss-scale, which its bf16 scripts pass and
// ignore, is a restating flag (train_megatron_flags.cpp).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace coc::cli {

struct PrecisionFlags {
  bool bf16 = false, fp16 = false;
  bool grad_reduce_in_bf16 = false;  ///< --grad-reduce-in-bf16: the data-parallel reduction in 16 bits
  /// The loss-scaling flags given (--loss-scale, --min-loss-scale, --loss-scale-window, --hysteresis) with their
  /// values, in registration order.
  std::vector<std::pair<const CLI::Option*, std::string>> loss_scaling;
};

/// Registers --bf16, --fp16, --grad-reduce-in-bf16 and the loss-scaling flags on `cmd`.
void add_precision_flags(CLI::App* cmd, PrecisionFlags& p);

/// Throws one uniform kInvalidArgument line when any precision flag is given: --bf16 with --fp16; a loss-scaling
/// flag (named with its value) without --fp16; --grad-reduce-in-bf16 without --bf16; else --bf16 or --fp16, which
/// coc does not train with yet. Does nothing when none is given.
void check_precision_flags(const PrecisionFlags& p);

}  // namespace coc::cli
