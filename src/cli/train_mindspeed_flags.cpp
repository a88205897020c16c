#include "cli/train_mindspeed_flags.h"

#include <fmt/format.h>

#include "cli/train_options.h"
#include "coc/core/error.h"
#include "coc/model/trainer.h"

namespace coc::cli {

namespace {

/// Ascend kernel selections and what coc does instead, always.
struct KernelFlag {
  const char* name;
  const char* coc_does;
};
constexpr KernelFlag kKernelFlags[] = {
    {"--use-fused-rmsnorm", "coc's RMSNorm is always one fused loop per row"},
    {"--use-fused-swiglu", "coc's SwiGLU is always one fused vectorised loop"},
    {"--use-fused-rotary-pos-emb", "coc's rotary embedding is always applied in place in one pass"},
    {"--use-flash-attn", "coc's attention always runs in query blocks against only the keys they may see"},
    {"--use-fused-ring-attention-update",
     "coc's ring attention always merges each block into the output by its log-sum-exp in one fp32 pass"},
};

}  // namespace

void add_mindspeed_flags(CLI::App* cmd, TrainOptions& o) {
  MindSpeedFlags& m = o.mindspeed;
  cmd->add_flag("--use-ascend-coc", m.use_ascend_coc,
                "MindSpeed's switch for CoC; CoC is on by default here, so it changes nothing (see --coc-mode)");
  cmd->add_option("--coc-mode", m.coc_mode,
                  "MindSpeed's CoC mode: 0 = Megatron's order, 1 = the same math without overlap (both run N = 1), "
                  "2 = CoC with --coc-parallel-num (the default)")
      ->check(CLI::Range(0, 2));
  cmd->add_flag("--use-ascend-mc2", m.use_ascend_mc2, "MindSpeed's MC2 fused kernels: the same as --use-mc2");
  for (const KernelFlag& k : kKernelFlags) {
    m.kernel_flags.push_back(
        cmd->add_flag(std::string(k.name))
            ->description(fmt::format("Accepted for MindSpeed scripts: selects an Ascend kernel; {}", k.coc_does)));
  }
}

void apply_mindspeed_flags(const MindSpeedFlags& m, TrainConfig& c) {
  if (m.use_ascend_mc2) c.use_mc2 = true;
  if (m.coc_mode == 0 || m.coc_mode == 1) {
    if (c.coc_fused_kernel || c.use_mc2)
      throw_invalid("--coc-mode {} runs without overlap, but --coc-fused-kernel or --use-mc2/--use-ascend-mc2 overlap "
                    "inside their kernels; drop them or use --coc-mode 2",
                    m.coc_mode);
    c.coc_parallel_num = 1;
    c.customized_coc.clear();
  }
}

std::vector<std::string> mindspeed_notes(const MindSpeedFlags& m) {
  std::vector<std::string> notes;
  for (const CLI::Option* opt : m.kernel_flags) {
    if (opt->count() == 0) continue;
    for (const KernelFlag& k : kKernelFlags)
      if (opt->check_name(k.name))
        notes.push_back(fmt::format("{}: selects an Ascend kernel; {} (accepted, nothing changes)", k.name, k.coc_does));
  }
  return notes;
}

}  // namespace coc::cli
