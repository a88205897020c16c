// Megatron's precision flags (cli/train_precision_flags.h).
#include "cli/train_precision_flags.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <iterator>
#include <stdexcept>
#include <utility>

#include "coc/core/error.h"
#include "coc/core/log.h"

namespace coc::cli {

namespace {
const char* const kGroup = "Mixed precision (Megatron's flags)";
}  // namespace

void add_precision_flags(CLI::App* cmd, PrecisionFlags& p) {
  cmd->add_flag("--bf16,!--no-bf16", p.bf16,
                "Megatron's bf16 mixed precision: fp32 master weights and AdamW state; GEMMs on the CPU's bf16 units with "
                "fp32 accumulation; activations stored as bf16 values; RMSNorm statistics, softmax, RoPE, the router "
                "and the loss in fp32; TP, CP and EP messages and the FSDP/ZeRO gathers of the weights only bf16 GEMMs "
                "read in 2-byte elements, as Megatron implies with --bf16 (docs/mixed-precision.md). --no-bf16 "
                "(coc's) turns it off, e.g. for a bench train --baseline")
      ->group(kGroup);
  cmd->add_flag("--fp32-residual-connection", p.fp32_residual_connection,
                "With --bf16 or --fp16: keep the residual stream in fp32 (Megatron's)")
      ->group(kGroup);
  cmd->add_flag("--fp16,!--no-fp16", p.fp16,
                "Megatron's fp16 mixed precision: fp16 values on fp32 kernels (x86 CPUs have no fp16 dot products, so "
                "it is no faster than fp32; --bf16 is), fp32 master weights, dynamic loss scaling; steps with "
                "inf/NaN gradients are skipped and counted. --no-fp16 (coc's) turns it off, e.g. over a --config "
                "file's fp16: true")
      ->group(kGroup);
  cmd->add_flag("--grad-reduce-in-bf16", p.grad_reduce_in_bf16,
                "The data-parallel gradient reduction in bf16, half the bytes (with --bf16; fp32 by default): each rank's "
                "gradient rounded to bf16, the sum taken in fp32 and rounded")
      ->group(kGroup);
  // --initial-loss-scale last: Megatron's bf16 scripts pass it too, and it means nothing without --fp16 there either.
  const std::pair<const char*, const char*> flags[] = {
      {"--loss-scale", "a constant loss scale S instead of the dynamic one (a power of 2 keeps the unscaling exact)"},
      {"--min-loss-scale", "the dynamic scale's floor (default 1)"},
      {"--loss-scale-window", "good steps, a whole number, before the dynamic scale doubles (default 1000)"},
      {"--hysteresis", "overflowing steps, a whole number, before the dynamic scale halves (default 2)"},
      {"--initial-loss-scale", "the dynamic scale's start (default 2^32); accepted and ignored without --fp16, as "
                               "Megatron's bf16 scripts pass it"}};
  p.loss_scaling.reserve(std::size(flags));  // CLI11 keeps a reference to each value: the vector must not move
  for (const auto& [name, what] : flags) {
    p.loss_scaling.emplace_back(nullptr, std::string());
    auto& slot = p.loss_scaling.back();
    const std::string only = std::string(name) == "--initial-loss-scale" ? "" : "; refused without --fp16";
    slot.first = cmd->add_option(name, slot.second,
                                 fmt::format("--fp16's loss scaling (Megatron's): {}{}", what, only))
                     ->type_name("VALUE")
                     ->group(kGroup);
  }
}

void check_precision_flags(const PrecisionFlags& p) {
  // The loss-scaling options take their value as text (loss_scale_config parses it), so a missing value takes the
  // next flag: name that before the flag's absence confuses the checks below.
  const auto number = [](const std::string& v) {
    char* end = nullptr;
    std::strtod(v.c_str(), &end);
    return !v.empty() && end == v.c_str() + v.size();
  };
  for (const auto& [opt, value] : p.loss_scaling)
    if (opt->count() > 0 && value.size() > 1 && value[0] == '-' && !number(value))
      throw_invalid("{} takes a number, not '{}': give {} a value before {}", opt->get_name(), value,
                    opt->get_name(), value);
  if (p.bf16 && p.fp16)
    throw_invalid("--bf16 and --fp16 together: choose one element type for the mixed-precision run (Megatron refuses "
                  "both too); where one comes from a --config file, --no-bf16 or --no-fp16 turns it off");
  if (!p.fp16)
    for (const auto& [opt, value] : p.loss_scaling)
      if (opt->count() > 0 && opt->get_name() != "--initial-loss-scale")
        throw_invalid("{} {} has no meaning without --fp16: loss scaling keeps fp16 gradients from underflowing, and "
                      "bf16 and fp32 have fp32's range; drop it, or train with --fp16",
                      opt->get_name(), value);
  if (!p.fp16)  // the --initial-loss-scale that goes unused: still a number (with --fp16 loss_scale_config checks)
    for (const auto& [opt, value] : p.loss_scaling)
      if (opt->count() > 0 && !(number(value) && std::strtod(value.c_str(), nullptr) > 0))
        throw_invalid("{} '{}' is not a positive number (it is ignored without --fp16, but must still be one)",
                      opt->get_name(), value);
  const auto given = [&](const char* name) {
    for (const auto& [opt, value] : p.loss_scaling)
      if (opt->get_name() == name) return opt->count() > 0;
    return false;
  };
  if (p.fp16 && given("--loss-scale") && log::rank() <= 0)
    for (const char* dynamic : {"--initial-loss-scale", "--min-loss-scale", "--loss-scale-window", "--hysteresis"})
      if (given(dynamic))
        log::warn("{} has no effect with --loss-scale: a constant scale never changes (Megatron ignores it too)",
                  dynamic);
  if (p.grad_reduce_in_bf16 && !p.bf16)
    throw_invalid("--grad-reduce-in-bf16 needs --bf16: the gradients to reduce in bf16 come from a bf16 run");
  if (p.fp32_residual_connection && !p.bf16 && !p.fp16)
    throw_invalid("--fp32-residual-connection needs --bf16 or --fp16: without them the residual stream is fp32 "
                  "already");
}

LossScaleConfig loss_scale_config(const PrecisionFlags& p) {
  LossScaleConfig c;
  for (const auto& [opt, value] : p.loss_scaling) {
    if (opt->count() == 0) continue;
    const std::string& name = opt->get_name();
    double v = 0;
    try {
      size_t used = 0;
      v = std::stod(value, &used);
      if (used != value.size()) throw std::invalid_argument(value);
    } catch (const std::exception&) {
      throw_invalid("{} '{}' is not a number", name, value);
    }
    if (name == "--loss-scale") c.constant = v;
    if (name == "--initial-loss-scale") c.initial = v;
    if (name == "--min-loss-scale") c.min = v;
    const bool count = name == "--loss-scale-window" || name == "--hysteresis";
    if (count && !(std::isfinite(v) && v == std::floor(v) && std::abs(v) < 1e15))
      throw_invalid("{} '{}' counts steps: give a whole number below 1e15", name, value);
    if (name == "--loss-scale-window") c.window = static_cast<int64_t>(v);
    if (name == "--hysteresis") c.hysteresis = static_cast<int64_t>(v);
  }
  c.validate();
  return c;
}

}  // namespace coc::cli
