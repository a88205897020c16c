// The environment-variable registry: every environment knob coc reads is declared once, here and in
// src/core/env_registry.cpp (name, default, help), and read only through these functions. No other file calls
// getenv (docs/design.md, core: every knob declared once; NCCL keeps one registry for the same reason: a user can
// list every knob with `coc env`, and a typo in a name is a compile error, not a silently unset knob).
//
// The registry covers three kinds of variables:
//  - coc's own knobs (COC_*),
//  - variables scripts/launch sets for the ranks (COC_LAUNCHER, COC_STDOUT_IS_TTY),
//  - variables of other software that coc inspects to diagnose a deployment (Open MPI's OMPI_*, MPICH's
//    PMI_SIZE, OpenBLAS's OPENBLAS_NUM_THREADS): `coc env` reads them to explain edge cases
//    14-19 of docs/edge-cases.md,
//  - conventions of the terminal coc only reads (TERM, NO_COLOR).
// A variable whose `reader` is neither "coc" nor "scripts/launch" belongs to other software: coc only reads it
// and never documents it as a knob of its own.
// Values are read from the process environment on every call (no cache), so tests may setenv() before reading.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace coc::env {

/// One declared variable. The enum makes reading an undeclared name a compile error.
enum class Var {
  kStdoutIsTty,              ///< COC_STDOUT_IS_TTY
  kLauncher,                 ///< COC_LAUNCHER
  kUniformErrorTimeoutMs,    ///< COC_UNIFORM_ERROR_TIMEOUT_MS
  kTestFusedKillRank,        ///< COC_TEST_FUSED_KILL_RANK (tests only)
  kTestFusedStopRank,        ///< COC_TEST_FUSED_STOP_RANK (tests only)
  kTestAutoTimed,            ///< COC_TEST_AUTO_TIMED (tests only)
  kTestAcrossNodes,          ///< COC_TEST_ACROSS_NODES (tests only)
  kMpi,                      ///< COC_MPI (read by scripts/launch)
  kMapBy,                    ///< COC_MAP_BY (read by scripts/launch)
  kMpirunExtra,              ///< COC_MPIRUN_EXTRA (read by scripts/launch)
  kGuardWaitS,               ///< COC_GUARD_WAIT_S (read by scripts/lib/rank_guard)
  kOmpiAllowRunAsRoot,       ///< OMPI_ALLOW_RUN_AS_ROOT
  kOmpiAllowRunAsRootConfirm,///< OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
  kOmpiCommWorldSize,        ///< OMPI_COMM_WORLD_SIZE (set by Open MPI's launcher)
  kOmpiBtl,                  ///< OMPI_MCA_btl
  kOmpiBtlTcpIfInclude,      ///< OMPI_MCA_btl_tcp_if_include
  kOmpiBtlTcpIfExclude,      ///< OMPI_MCA_btl_tcp_if_exclude
  kOmpiVaderBackingDirectory,///< OMPI_MCA_btl_vader_backing_directory
  kPmiSize,                  ///< PMI_SIZE (set by MPICH's launcher, Hydra)
  kOpenblasNumThreads,       ///< OPENBLAS_NUM_THREADS
  kOmpNumThreads,            ///< OMP_NUM_THREADS
  kOpenblasCoretype,         ///< OPENBLAS_CORETYPE
  kBlasCoreDetected,         ///< COC_BLAS_CORE_DETECTED (set by coc when it re-executes itself)
  kTestBlasCore,             ///< COC_TEST_BLAS_CORE (tests only)
  kGemmBackend,              ///< COC_GEMM_BACKEND
  kTestFsdpDelaySeed,        ///< COC_TEST_FSDP_DELAY_SEED (tests only)
  kTerm,                     ///< TERM (set by the terminal)
  kNoColor,                  ///< NO_COLOR (the no-color.org convention)
};

/// Declaration of one variable: its name, the value used when it is unset ("" = none) and what it does.
struct Spec {
  Var var;
  std::string_view name;
  std::string_view default_value;
  std::string_view help;
  std::string_view reader;  ///< whose it is: "coc", "scripts/launch", "Open MPI", "MPICH", "OpenBLAS", "terminal"
};

/// Every declared variable, in declaration order.
std::span<const Spec> all();
/// The declaration of `v`.
const Spec& spec(Var v);

/// The raw value of `v` in this process's environment; nullopt when unset (an empty value counts as set).
std::optional<std::string> raw(Var v);
/// The value of `v`, or its declared default when unset.
std::string get(Var v);
/// True when `v` is set (to anything, including "").
bool is_set(Var v);
/// The value of `v` parsed as a decimal integer; its default when unset. Throws a uniform kInvalidArgument error
/// naming the variable when the value (or the default) is not an integer.
int64_t get_int(Var v);
/// True when `v` is set to "1", "true", "yes" or "on" (case-insensitive). Unset: the default parsed the same way.
bool get_bool(Var v);
/// Sets `v` in this process's environment (inherited by an exec and by child processes). Only for start-up code
/// that runs before any thread (select_blas_core) and for tests: setenv is not thread-safe. Returns false when
/// the C library refuses (no memory).
bool set(Var v, const std::string& value);
/// Removes `v` from this process's environment (same caveats as set).
void unset(Var v);

}  // namespace coc::env
