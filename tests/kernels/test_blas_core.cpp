// The OpenBLAS kernel check (coc/kernels/blas_core.h): which detected cores count as a fallback to fix, on which
// CPUs; the check of the running library; and the description `coc env` prints. The re-execution itself is tested
// end to end by tests/cli/env.sh (COC_TEST_BLAS_CORE).
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "coc/core/env_registry.h"
#include "coc/kernels/blas_core.h"

namespace coc {
namespace {

BlasCoreCheck make(const std::string& core, int core_level, int cpu_level, bool dynamic = true) {
  BlasCoreCheck c;
  c.core = core;
  c.core_level = core_level;
  c.cpu_level = cpu_level;
  c.dynamic_arch = dynamic;
  c.recommended = cpu_level == 3 ? "SkylakeX" : cpu_level == 2 ? "Haswell" : cpu_level == 1 ? "Sandybridge" : "";
  return c;
}

TEST(BlasCore, OnlyAFallbackBelowTheCpuIsFixed) {
  EXPECT_TRUE(make("Prescott", 0, 3).needs_fix()) << "SSE3 kernels on an AVX-512 CPU (Emerald Rapids, 0.3.21)";
  EXPECT_TRUE(make("Prescott", 0, 2).needs_fix());
  EXPECT_TRUE(make("Sandybridge", 1, 2).needs_fix()) << "AVX kernels on an AVX2/FMA CPU";
  EXPECT_FALSE(make("Prescott", 0, 0).needs_fix()) << "nothing better to pick";
  EXPECT_FALSE(make("Haswell", 2, 3).needs_fix()) << "a vector kernel family is never swapped for another";
  EXPECT_FALSE(make("Zen", 2, 2).needs_fix());
  EXPECT_FALSE(make("SkylakeX", 3, 3).needs_fix());
  EXPECT_FALSE(make("SomeFutureCore", -1, 3).needs_fix()) << "an unknown name is left alone";
  EXPECT_FALSE(make("Prescott", 0, 3, /*dynamic=*/false).needs_fix()) << "a fixed-arch build cannot switch";
}

TEST(BlasCore, KernelsBelowTheCpuAreReportedButAVectorFamilyIsKept) {
  EXPECT_TRUE(make("Haswell", 2, 3).below_cpu()) << "AVX2 kernels on an AVX-512 CPU";
  EXPECT_TRUE(make("Prescott", 0, 3).below_cpu()) << "every fallback is below too";
  EXPECT_FALSE(make("Haswell", 2, 2).below_cpu());
  EXPECT_FALSE(make("Cooperlake", 3, 3).below_cpu());
  EXPECT_FALSE(make("SomeFutureCore", -1, 3).below_cpu());
  EXPECT_FALSE(make("Haswell", 2, 3, /*dynamic=*/false).below_cpu()) << "a fixed-arch build cannot switch";
}

class EnvGuard {
 public:
  explicit EnvGuard(env::Var v) : v_(v), old_(env::raw(v)) {}
  ~EnvGuard() {
    if (old_)
      env::set(v_, *old_);
    else
      env::unset(v_);
  }

 private:
  env::Var v_;
  std::optional<std::string> old_;
};

TEST(BlasCore, ChecksTheRunningLibrary) {
  const BlasCoreCheck c = check_blas_core();
  EXPECT_FALSE(c.core.empty());
  EXPECT_TRUE(c.dynamic_arch) << "Debian's OpenBLAS is a DYNAMIC_ARCH build";
  EXPECT_GE(c.cpu_level, 0);
  EXPECT_LE(c.cpu_level, 3);
  EXPECT_FALSE(c.needs_fix()) << "the test main runs select_blas_core first, as coc does: " << c.core;
}

TEST(BlasCore, TestKnobStandsInForOpenBlasOwnChoice) {
  EnvGuard a(env::Var::kOpenblasCoretype), b(env::Var::kTestBlasCore), d(env::Var::kBlasCoreDetected);
  env::unset(env::Var::kOpenblasCoretype);
  env::unset(env::Var::kBlasCoreDetected);
  env::set(env::Var::kTestBlasCore, "Prescott");
  const BlasCoreCheck c = check_blas_core();
  EXPECT_EQ(c.core, "Prescott");
  EXPECT_EQ(c.core_level, 0);
  EXPECT_EQ(c.needs_fix(), c.cpu_level > 0);
  // A core the user chose wins over the knob: it only stands in for OpenBLAS's own detection.
  env::set(env::Var::kOpenblasCoretype, "Haswell");
  EXPECT_NE(check_blas_core().core, "Prescott");
}

TEST(BlasCore, DescriptionSaysWhoChoseTheKernels) {
  EnvGuard a(env::Var::kOpenblasCoretype), d(env::Var::kBlasCoreDetected);
  env::unset(env::Var::kOpenblasCoretype);
  env::unset(env::Var::kBlasCoreDetected);
  EXPECT_EQ(describe_blas_core(make("Zen", 2, 2)), "Zen");
  env::set(env::Var::kOpenblasCoretype, "Haswell");
  EXPECT_EQ(describe_blas_core(make("Haswell", 2, 3)), "Haswell (OPENBLAS_CORETYPE=Haswell)");
  env::set(env::Var::kBlasCoreDetected, "Prescott");
  env::set(env::Var::kOpenblasCoretype, "SkylakeX");
  const std::string d1 = describe_blas_core(make("SkylakeX", 3, 3));
  EXPECT_NE(d1.find("set by coc: OpenBLAS picked Prescott"), std::string::npos) << d1;
}

TEST(BlasCore, AdviceNamesTheKernelsWhoChoseThemAndTheFix) {
  EnvGuard guard(env::Var::kOpenblasCoretype);
  env::set(env::Var::kOpenblasCoretype, "Haswell");
  BlasCoreAdvice a = blas_core_advice(make("Haswell", 2, 3));
  EXPECT_NE(a.message.find("Haswell kernels (OPENBLAS_CORETYPE=Haswell) on a CPU that supports AVX-512"),
            std::string::npos)
      << a.message;
  EXPECT_NE(a.fix.find("unset OPENBLAS_CORETYPE"), std::string::npos) << a.fix;
  env::unset(env::Var::kOpenblasCoretype);
  a = blas_core_advice(make("Zen", 2, 3));
  EXPECT_NE(a.message.find("(OpenBLAS's own choice)"), std::string::npos) << a.message;
  EXPECT_NE(a.fix.find("export OPENBLAS_CORETYPE=SkylakeX"), std::string::npos) << a.fix;
  a = blas_core_advice(make("Prescott", 0, 2));
  EXPECT_NE(a.message.find("several times slower"), std::string::npos) << a.message;
  EXPECT_NE(a.fix.find("export OPENBLAS_CORETYPE=Haswell"), std::string::npos) << a.fix;
  a = blas_core_advice(make("SkylakeX", 3, 3));
  EXPECT_TRUE(a.message.empty() && a.fix.empty());
}

}  // namespace
}  // namespace coc
