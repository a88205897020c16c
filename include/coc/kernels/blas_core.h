// Which OpenBLAS kernels run, and the start-up fix when OpenBLAS picks the wrong ones.
//
// Why: a DYNAMIC_ARCH OpenBLAS (Debian's) chooses its kernels once, in a library constructor, from the CPU's
// family and model number. A model it does not know gets its oldest x86-64 kernels, Prescott's SSE3. Measured with
// Debian 12's OpenBLAS 0.3.21 on an Intel Xeon of family 6 model 207 (Emerald Rapids, AVX-512): Prescott ran
// sgemm [4096, 1024]·[1024, 1024] at 16-27 GFLOP/s on one core, SkylakeX at 105-108 GFLOP/s. Every layer of coc is
// GEMM-bound, so this one choice slows training 4-6x and moves every overlap figure. OpenBLAS reads its choice
// from OPENBLAS_CORETYPE before main() runs, so the only fix from inside the process is to set it and execute the
// program again (select_blas_core). OpenBLAS 0.3.22+ knows these models; the check then finds nothing to fix.
#pragma once

#include <string>

namespace coc {

/// The OpenBLAS kernels of this process against what the CPU can run.
/// Levels: 0 = SSE only, 1 = AVX, 2 = AVX2 + FMA, 3 = AVX-512 (F, CD, BW, DQ, VL: what OpenBLAS's SkylakeX
/// kernels use); -1 = a core name this table does not know (nothing is changed then).
struct BlasCoreCheck {
  std::string core;         ///< openblas_get_corename(): "Prescott", "SkylakeX", "Zen", ...
  bool dynamic_arch = false;///< the library can switch kernels (OPENBLAS_CORETYPE is honoured)
  int core_level = -1;      ///< level of `core`'s kernels
  int cpu_level = 0;        ///< level of this CPU, with the OS's support of the vector state (xgetbv)
  std::string recommended;  ///< the OPENBLAS_CORETYPE for cpu_level ("SkylakeX", "Haswell"/"Zen", "Sandybridge")
  /// True when OpenBLAS fell back to kernels of level <= 1 on a CPU of a higher level and can switch: the case
  /// select_blas_core fixes. A vector kernel family (level >= 2) is never swapped for another.
  bool needs_fix() const;
  /// True when the kernels are of any lower level than the CPU's and the library can switch: needs_fix, or AVX2
  /// kernels on an AVX-512 CPU, which coc reports (blas_core_advice) but does not override, because OpenBLAS or the
  /// user chose a vector family deliberately. Measured on a 2-vCPU AMD EPYC (Zen 5) VM with OpenBLAS 0.3.21 and
  /// OPENBLAS_CORETYPE=Haswell set in its environment: sgemm [4096, 1024]·[1024, 1024] on one core took 100-105 ms
  /// with the Haswell kernels and 50-54 ms with Cooperlake's or SkylakeX's (OpenBLAS's own choice there).
  bool below_cpu() const;
};

/// What to tell the user about the kernels of `c` when below_cpu(): one sentence on what runs and what it costs,
/// and the fix. Empty strings otherwise.
struct BlasCoreAdvice {
  std::string message;
  std::string fix;
};
BlasCoreAdvice blas_core_advice(const BlasCoreCheck& c);

/// Inspects the running OpenBLAS and CPU. Never throws.
BlasCoreCheck check_blas_core();

/// Call first in main(), before MPI_Init and before coc starts any thread (OpenBLAS's own pool may already run; it
/// never reads the environment again, and exec ends it). When check_blas_core().needs_fix() and the
/// user has not set OPENBLAS_CORETYPE, sets it to the recommended core, records the detected one in
/// COC_BLAS_CORE_DETECTED and re-executes the program (/proc/self/exe, same argv and environment, same pid, so an
/// MPI launcher sees the same process). Returns only when nothing needed fixing, when the user chose a core, when
/// this is already the re-executed process, or when exec failed (then `coc env` warns). argv must be main's,
/// null-terminated.
void select_blas_core(char** argv);

/// One line for `coc env`: the running core and, if coc switched it, from what and why.
std::string describe_blas_core(const BlasCoreCheck& c);

}  // namespace coc
