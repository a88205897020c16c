// The one table of environment variables coc knows about, and the only getenv() calls in coc.
#include "coc/core/env_registry.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include "coc/core/error.h"

namespace coc::env {
namespace {

// Order must follow enum Var: spec() indexes this table by the enum value (checked at compile time below).
// "Edge case N" in the help texts refers to docs/edge-cases.md.
constexpr std::array<Spec, 28> kSpecs{{
    {Var::kStdoutIsTty, "COC_STDOUT_IS_TTY", "0",
     "1 when the launcher's stdout is a terminal. Set by scripts/launch because isatty() in a rank does not tell: "
     "Open MPI gives every rank a pseudo-terminal even when mpirun's own stdout is a pipe or file. Progress bars "
     "and colour use it.",
     "coc"},
    {Var::kLauncher, "COC_LAUNCHER", "",
     "Set to 'scripts/launch' by scripts/launch. `coc env` uses it to tell a run through the project launcher "
     "(which handles root, oversubscription, binding and BLAS threads) from a bare mpirun or a singleton.",
     "coc"},
    {Var::kUniformErrorTimeoutMs, "COC_UNIFORM_ERROR_TIMEOUT_MS", "10000",
     "How long a rank that hit a uniform error (bad flags or config, seen by every rank) waits for the other ranks "
     "to report it too before it aborts the whole job instead of exiting cleanly (edge case 18).",
     "coc"},
    {Var::kTestFusedKillRank, "COC_TEST_FUSED_KILL_RANK", "-1",
     "Tests only: the world rank that kills itself (SIGKILL) in the middle of its first fused kernel, after "
     "publishing one tile, to check that the peers waiting on its shared-memory flags end the job within their "
     "deadline and leave nothing in /dev/shm. -1 = never.",
     "coc"},
    {Var::kTestFusedStopRank, "COC_TEST_FUSED_STOP_RANK", "-1",
     "Tests only: the world rank that stops itself (SIGSTOP) in the middle of its first fused kernel. mpirun does "
     "not notice a stopped rank, so this checks that the waiting peers' own flag deadline "
     "(--distributed-timeout-minutes) ends the job. -1 = never.",
     "coc"},
    {Var::kTestAutoTimed, "COC_TEST_AUTO_TIMED", "0",
     "Tests only: --coc-parallel-num auto times its candidates even when the tp ranks share one node (where it "
     "chooses serial without timing), so that the timing and --coc-tuning-cache can be tested on one machine.",
     "coc"},
    {Var::kTestAcrossNodes, "COC_TEST_ACROSS_NODES", "0",
     "Tests only: the segmented dY gathers behave as across nodes (the down projection's weight gradient summed as "
     "dY's rows arrive, RowParallelLinear::backward), so that the path can be tested on one machine.",
     "coc"},
    {Var::kMpi, "COC_MPI", "openmpi", "Which MPI scripts/launch uses: openmpi or mpich.", "scripts/launch"},
    {Var::kMapBy, "COC_MAP_BY", "core", "Open MPI --map-by value used by scripts/launch.", "scripts/launch"},
    {Var::kMpirunExtra, "COC_MPIRUN_EXTRA", "", "Extra flags scripts/launch passes to mpirun / mpiexec.",
     "scripts/launch"},
    {Var::kGuardWaitS, "COC_GUARD_WAIT_S", "3",
     "Seconds a rank that exits non-zero without a message waits for another rank's message (rank 0 may still be "
     "writing the error it exits for) before scripts/launch names it.",
     "scripts/lib/rank_guard"},
    {Var::kOmpiAllowRunAsRoot, "OMPI_ALLOW_RUN_AS_ROOT", "",
     "Open MPI's mpirun refuses to run as root unless this and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM are both 1 (or "
     "--allow-run-as-root is given; scripts/launch adds it). Edge case 14.",
     "Open MPI"},
    {Var::kOmpiAllowRunAsRootConfirm, "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "",
     "Second half of Open MPI's run-as-root opt-in (see OMPI_ALLOW_RUN_AS_ROOT).", "Open MPI"},
    {Var::kOmpiCommWorldSize, "OMPI_COMM_WORLD_SIZE", "",
     "Set by Open MPI's mpirun in every rank; unset in a singleton (a program started without mpirun).",
     "Open MPI"},
    {Var::kOmpiBtl, "OMPI_MCA_btl", "",
     "Open MPI byte-transfer layers to use (e.g. 'self,vader,tcp'); empty = Open MPI's choice.", "Open MPI"},
    {Var::kOmpiBtlTcpIfInclude, "OMPI_MCA_btl_tcp_if_include", "",
     "Network interfaces (or CIDR subnets) Open MPI's TCP transport may use. A wrong interface makes collectives "
     "100x slower (edge case 19).",
     "Open MPI"},
    {Var::kOmpiBtlTcpIfExclude, "OMPI_MCA_btl_tcp_if_exclude", "",
     "Network interfaces Open MPI's TCP transport must not use.", "Open MPI"},
    {Var::kOmpiVaderBackingDirectory, "OMPI_MCA_btl_vader_backing_directory", "/dev/shm",
     "Where Open MPI's shared-memory transport (vader) puts its segments. Point it at a larger tmpfs when /dev/shm "
     "is small (edge case 17).",
     "Open MPI"},
    {Var::kPmiSize, "PMI_SIZE", "",
     "Set by MPICH's mpiexec (Hydra) in every rank; unset in a singleton. Only read to name the launcher.",
     "MPICH"},
    {Var::kOpenblasNumThreads, "OPENBLAS_NUM_THREADS", "",
     "OpenBLAS threads per process; unset = one per core. scripts/launch sets 1 (one BLAS thread per pinned "
     "rank; edge cases 15-16).",
     "OpenBLAS"},
    {Var::kOmpNumThreads, "OMP_NUM_THREADS", "",
     "OpenMP threads per process (OpenBLAS falls back to it). scripts/launch sets 1.", "OpenBLAS"},
    {Var::kOpenblasCoretype, "OPENBLAS_CORETYPE", "",
     "Forces the kernels of a DYNAMIC_ARCH OpenBLAS (e.g. SkylakeX, Haswell, Zen). Unset, OpenBLAS picks them from "
     "the CPU's model number, and on a model it does not know (OpenBLAS 0.3.21 on Intel Sapphire/Emerald Rapids) "
     "it falls back to Prescott's SSE3 kernels, 4-6x slower; coc then sets it from the CPU's features and "
     "re-executes itself (coc/kernels/blas_core.h). A value you set is kept.",
     "OpenBLAS"},
    {Var::kBlasCoreDetected, "COC_BLAS_CORE_DETECTED", "",
     "Set by coc, not by users: the core OpenBLAS had picked by itself when coc set OPENBLAS_CORETYPE and "
     "re-executed itself. `coc env` reports it; its presence also stops a second re-execution.",
     "coc"},
    {Var::kTestBlasCore, "COC_TEST_BLAS_CORE", "",
     "Tests only: while OPENBLAS_CORETYPE is unset, coc takes this as the core OpenBLAS picked by itself, so that "
     "the kernel fix (re-execution with OPENBLAS_CORETYPE) can be tested on CPUs OpenBLAS knows. Empty = the real "
     "one.",
     "coc"},
    {Var::kGemmBackend, "COC_GEMM_BACKEND", "auto",
     "The library of coc's fp32 GEMMs: auto (oneDNN where it runs AVX-512 kernels, OpenBLAS otherwise), onednn or "
     "openblas. The --gemm-backend flag of coc train, check and bench takes precedence. 16-bit GEMMs always run on "
     "oneDNN (coc/kernels/gemm.h).",
     "coc"},
    {Var::kTestFsdpDelaySeed, "COC_TEST_FSDP_DELAY_SEED", "0",
     "Tests only: when non-zero, every parameter all-gather of sharded data parallelism "
     "(--data-parallel-sharding-strategy optim_grads_params) sleeps a pseudo-random 0-2 ms, seeded by this value "
     "and the rank, before it is posted, so that tests can check the losses do not depend on the gathers' timing. "
     "0 = no delay.",
     "coc"},
    {Var::kTerm, "TERM", "",
     "The terminal type. 'dumb' turns progress bars and colour off (coc/core/progress_bar.h).", "terminal"},
    {Var::kNoColor, "NO_COLOR", "",
     "Set (to anything) to turn colour off in `coc analyze`'s table (the no-color.org convention).", "terminal"},
}};

constexpr bool table_in_enum_order() {
  for (size_t i = 0; i < kSpecs.size(); ++i)
    if (static_cast<size_t>(kSpecs[i].var) != i) return false;
  return true;
}
static_assert(static_cast<size_t>(Var::kNoColor) + 1 == kSpecs.size(), "every Var needs one Spec row");
static_assert(table_in_enum_order(), "kSpecs rows must follow the order of enum Var");

bool truthy(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s == "1" || s == "true" || s == "yes" || s == "on";
}

}  // namespace

std::span<const Spec> all() { return kSpecs; }

const Spec& spec(Var v) {
  const auto i = static_cast<size_t>(v);
  COC_ASSERT(i < kSpecs.size(), "undeclared environment variable #{}", i);
  return kSpecs[i];
}

std::optional<std::string> raw(Var v) {
  // The only getenv in coc. Nobody calls setenv concurrently (only tests, before threads start).
  const char* s = std::getenv(std::string(spec(v).name).c_str());
  if (!s) return std::nullopt;
  return std::string(s);
}

std::string get(Var v) {
  auto r = raw(v);
  return r ? *r : std::string(spec(v).default_value);
}

bool is_set(Var v) { return raw(v).has_value(); }

int64_t get_int(Var v) {
  const std::string s = get(v);
  int64_t out = 0;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  if (s.empty() || ec != std::errc() || p != end)
    throw_invalid("environment variable {}='{}' is not an integer; unset it or set a whole number ({})",
                  spec(v).name, s, spec(v).help);
  return out;
}

bool get_bool(Var v) { return truthy(get(v)); }

bool set(Var v, const std::string& value) {
  return ::setenv(std::string(spec(v).name).c_str(), value.c_str(), 1) == 0;
}

void unset(Var v) { ::unsetenv(std::string(spec(v).name).c_str()); }

}  // namespace coc::env
