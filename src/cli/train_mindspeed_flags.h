// MindSpeed's and Megatron's flags that `coc train` accepts with their MindSpeed meaning, so that a MindSpeed
// launch script's argument list runs unchanged (`coc train --help` lists them):
//   --use-ascend-coc          turn CoC on (coc's default already: it sets nothing)
//   --coc-mode 0|1|2          0 = Megatron's order, 1 = the same math without overlap (both run N = 1, coc's
//                             serial schedule), 2 = CoC with --coc-parallel-num (coc's default)
//   --use-ascend-mc2          MC2, the fused GEMM+collective kernels: coc's --use-mc2
//   --profile-save-path DIR   the profiler's output folder: coc's --profile-dir (train_profile.cpp)
// and the flags that only pick an Ascend kernel for something coc always does on the CPU (fused RMSNorm, SwiGLU,
// rotary embedding, flash attention, ...): accepted, each with a one-line note on rank 0.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "coc/model/trainer.h"

namespace coc::cli {

struct TrainOptions;

/// Values of the MindSpeed flags as parsed (TrainOptions::mindspeed).
struct MindSpeedFlags {
  bool use_ascend_coc = false;
  int coc_mode = -1;  ///< -1: not given
  bool use_ascend_mc2 = false;
  std::vector<const CLI::Option*> kernel_flags;  ///< the NPU-kernel flags registered (notes for those given)
};

/// Registers the MindSpeed flags above on `cmd`.
void add_mindspeed_flags(CLI::App* cmd, TrainOptions& o);

/// Applies the parsed MindSpeed flags to `c` (inside TrainOptions::resolve). Throws a uniform kInvalidArgument for
/// --coc-mode outside 0..2, and for --coc-mode 0/1 with --coc-fused-kernel or --use-mc2 (which overlap).
void apply_mindspeed_flags(const MindSpeedFlags& m, TrainConfig& c);

/// One line per NPU-kernel flag given, for rank 0 to print: "--use-fused-rmsnorm: ... (accepted; nothing changes)".
std::vector<std::string> mindspeed_notes(const MindSpeedFlags& m);

}  // namespace coc::cli
