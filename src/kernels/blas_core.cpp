// OpenBLAS kernel selection check and fix (coc/kernels/blas_core.h).
#include "coc/kernels/blas_core.h"

#include <cblas.h>
#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <utility>

#include "coc/core/env_registry.h"

namespace coc {
namespace {

/// Kernel level of OpenBLAS's x86-64 core names (driver/others/dynamic.c, corename[]); -1 for any other name.
int level_of_core(std::string_view core) {
  static constexpr std::array<std::pair<std::string_view, int>, 26> kLevels{{
      {"Katmai", 0},      {"Coppermine", 0}, {"Northwood", 0},  {"Prescott", 0},   {"Banias", 0},
      {"Atom", 0},        {"Core2", 0},      {"Penryn", 0},     {"Dunnington", 0}, {"Nehalem", 0},
      {"Athlon", 0},      {"Opteron", 0},    {"Opteron_SSE3", 0}, {"Barcelona", 0}, {"Nano", 0},
      {"Bobcat", 0},      {"Sandybridge", 1}, {"Bulldozer", 1}, {"Piledriver", 1}, {"Steamroller", 1},
      {"Haswell", 2},     {"Excavator", 2},  {"Zen", 2},        {"SkylakeX", 3},   {"Cooperlake", 3},
      {"SapphireRapids", 3},
  }};
  for (const auto& [name, level] : kLevels)
    if (core == name) return level;
  return -1;
}

int cpu_level() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // libgcc's __builtin_cpu_supports reports a vector extension only when the OS saves its state (XCR0), which
  // is what a VM that hides AVX-512 from its guest needs.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return 3;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
  if (__builtin_cpu_supports("avx")) return 1;
#endif
  return 0;
}

std::string recommended_core(int level) {
  switch (level) {
    case 3:
      return "SkylakeX";  // also OpenBLAS 0.3.22+'s choice for Sapphire Rapids' fp32 GEMM and for AMD Zen 4
    case 2:
#if defined(__x86_64__) || defined(__i386__)
      if (__builtin_cpu_is("amd")) return "Zen";
#endif
      return "Haswell";
    case 1:
      return "Sandybridge";
    default:
      return "";
  }
}

}  // namespace

bool BlasCoreCheck::needs_fix() const {
  return dynamic_arch && core_level >= 0 && core_level <= 1 && cpu_level > core_level && !recommended.empty();
}

bool BlasCoreCheck::below_cpu() const {
  return dynamic_arch && core_level >= 0 && cpu_level > core_level && !recommended.empty();
}

BlasCoreAdvice blas_core_advice(const BlasCoreCheck& c) {
  if (!c.below_cpu()) return {};
  const char* cpu = c.cpu_level == 3 ? "AVX-512" : c.cpu_level == 2 ? "AVX2/FMA" : "AVX";
  const bool chosen = env::is_set(env::Var::kOpenblasCoretype);
  const std::string by = chosen ? fmt::format(" (OPENBLAS_CORETYPE={})", env::get(env::Var::kOpenblasCoretype))
                                : std::string(" (OpenBLAS's own choice)");
  if (c.needs_fix())
    return {fmt::format("OpenBLAS runs its {} kernels{} on a CPU that supports {}: GEMMs run several times slower "
                        "(measured 4-6x for Prescott against SkylakeX)",
                        c.core, by, cpu),
            fmt::format("export OPENBLAS_CORETYPE={} (or unset OPENBLAS_CORETYPE and let coc choose)",
                        c.recommended)};
  return {fmt::format("OpenBLAS runs its {} kernels{} on a CPU that supports {}: GEMMs may run about half as fast "
                      "(measured 1.9x for Haswell against Cooperlake on an AMD EPYC Zen 5)",
                      c.core, by, cpu),
          chosen ? fmt::format("unset OPENBLAS_CORETYPE (OpenBLAS then picks its own kernels) or export "
                               "OPENBLAS_CORETYPE={}",
                               c.recommended)
                 : fmt::format("export OPENBLAS_CORETYPE={} and compare with coc bench overlap", c.recommended)};
}

BlasCoreCheck check_blas_core() {
  BlasCoreCheck c;
  const char* name = openblas_get_corename();
  c.core = name ? name : "";
  if (const std::string pretend = env::get(env::Var::kTestBlasCore);
      !pretend.empty() && !env::is_set(env::Var::kOpenblasCoretype))
    c.core = pretend;
  const char* config = openblas_get_config();
  c.dynamic_arch = config && std::strstr(config, "DYNAMIC_ARCH") != nullptr;
  c.core_level = level_of_core(c.core);
  c.cpu_level = cpu_level();
  c.recommended = recommended_core(c.cpu_level);
  return c;
}

void select_blas_core(char** argv) {
  if (env::is_set(env::Var::kOpenblasCoretype) || env::is_set(env::Var::kBlasCoreDetected)) return;
  const BlasCoreCheck c = check_blas_core();
  if (!c.needs_fix()) return;
  if (env::set(env::Var::kOpenblasCoretype, c.recommended) && env::set(env::Var::kBlasCoreDetected, c.core)) {
    std::fflush(nullptr);
    ::execv("/proc/self/exe", argv);
  }
  // setenv or exec failed (no /proc, say): carry on with the slow kernels, and leave no OPENBLAS_CORETYPE that
  // `coc env` would take for the user's choice. COC_BLAS_CORE_DETECTED names the core that is still running, so
  // `coc env` warns with the fix.
  env::unset(env::Var::kOpenblasCoretype);
}

std::string describe_blas_core(const BlasCoreCheck& c) {
  const std::string detected = env::get(env::Var::kBlasCoreDetected);
  if (!detected.empty() && detected != c.core)
    return fmt::format("{} (set by coc: OpenBLAS picked {}, its fallback for a CPU model it does not know)", c.core,
                       detected);
  if (env::is_set(env::Var::kOpenblasCoretype))
    return fmt::format("{} (OPENBLAS_CORETYPE={})", c.core, env::get(env::Var::kOpenblasCoretype));
  return c.core;
}

}  // namespace coc
