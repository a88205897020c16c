// The progress bar and the terminal test (coc/core/progress_bar.h). is_terminal reads TERM, COC_STDOUT_IS_TTY and
// OMPI_COMM_WORLD_SIZE through the environment registry; each case sets them and restores them afterwards.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "coc/core/env_registry.h"
#include "coc/core/progress_bar.h"

namespace coc {
namespace {

/// Sets (or unsets, with nullopt) a registry variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(env::Var v, std::optional<std::string> value) : var_(v), saved_(env::raw(v)) { apply(value); }
  ~ScopedEnv() { apply(saved_); }

 private:
  void apply(const std::optional<std::string>& v) {
    if (v) env::set(var_, *v);
    else env::unset(var_);
  }
  env::Var var_;
  std::optional<std::string> saved_;
};

TEST(ProgressBar, DrawsTheFractionDone) {
  EXPECT_EQ(progress_bar(0, 10, 10), "[>         ]");
  EXPECT_EQ(progress_bar(5, 10, 10), "[=====>    ]");
  EXPECT_EQ(progress_bar(10, 10, 10), "[==========]");
  EXPECT_EQ(progress_bar(3, 0, 4), "[====]");  // no total: full
}

TEST(IsTerminal, TermDumbWinsOverEverything) {
  ScopedEnv term(env::Var::kTerm, "dumb");
  ScopedEnv tty(env::Var::kStdoutIsTty, "1");
  EXPECT_FALSE(is_terminal(1));
}

TEST(IsTerminal, TheLaunchersWordDecidesInARank) {
  ScopedEnv term(env::Var::kTerm, "xterm");
  ScopedEnv ompi(env::Var::kOmpiCommWorldSize, "2");
  {
    ScopedEnv tty(env::Var::kStdoutIsTty, "1");
    EXPECT_TRUE(is_terminal(1));
  }
  {
    ScopedEnv tty(env::Var::kStdoutIsTty, "0");
    EXPECT_FALSE(is_terminal(1));
  }
  // Under Open MPI's mpirun without scripts/launch nothing tells: no bar.
  ScopedEnv tty(env::Var::kStdoutIsTty, std::nullopt);
  EXPECT_FALSE(is_terminal(1));
}

}  // namespace
}  // namespace coc
