// The environment registry (coc/core/env_registry.h): every knob declared once, read through it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "coc/core/env_registry.h"
#include "coc/core/error.h"

namespace coc {
namespace {

TEST(EnvRegistry, EveryVariableDeclaredOnceWithHelp) {
  std::set<std::string> names;
  for (const auto& s : env::all()) {
    EXPECT_TRUE(names.insert(std::string(s.name)).second) << "declared twice: " << s.name;
    EXPECT_FALSE(s.help.empty()) << s.name;
    EXPECT_FALSE(s.reader.empty()) << s.name;
    EXPECT_EQ(&env::spec(s.var), &s);
  }
  EXPECT_TRUE(names.count("COC_STDOUT_IS_TTY"));
  EXPECT_TRUE(names.count("OMPI_ALLOW_RUN_AS_ROOT"));
}

// Variables of other software that coc only reads are declared too, under their owner: no getenv outside the
// registry, and `coc env --verbose` lists them.
TEST(EnvRegistry, ExternalVariablesAreDeclaredUnderTheirOwner) {
  EXPECT_EQ(env::spec(env::Var::kTerm).name, "TERM");
  EXPECT_EQ(env::spec(env::Var::kTerm).reader, "terminal");
  EXPECT_EQ(env::spec(env::Var::kNoColor).name, "NO_COLOR");
  EXPECT_EQ(env::spec(env::Var::kNoColor).reader, "terminal");
  EXPECT_EQ(env::spec(env::Var::kPmiSize).reader, "MPICH");
  EXPECT_EQ(env::spec(env::Var::kOmpiCommWorldSize).reader, "Open MPI");
  ::setenv("NO_COLOR", "", 1);  // set to nothing still counts (the analyze table checks is_set)
  EXPECT_TRUE(env::is_set(env::Var::kNoColor));
  ::unsetenv("NO_COLOR");
  EXPECT_FALSE(env::is_set(env::Var::kNoColor));
}

TEST(EnvRegistry, ReadsSetValuesAndDefaults) {
  const auto v = env::Var::kUniformErrorTimeoutMs;
  ::unsetenv("COC_UNIFORM_ERROR_TIMEOUT_MS");
  EXPECT_FALSE(env::is_set(v));
  EXPECT_FALSE(env::raw(v).has_value());
  EXPECT_EQ(env::get(v), "10000");
  EXPECT_EQ(env::get_int(v), 10000);

  ::setenv("COC_UNIFORM_ERROR_TIMEOUT_MS", "250", 1);
  EXPECT_TRUE(env::is_set(v));
  EXPECT_EQ(env::get_int(v), 250);

  ::setenv("COC_UNIFORM_ERROR_TIMEOUT_MS", "25x", 1);
  try {
    env::get_int(v);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_TRUE(e.uniform());
    EXPECT_NE(std::string(e.what()).find("COC_UNIFORM_ERROR_TIMEOUT_MS='25x'"), std::string::npos) << e.what();
  }
  ::setenv("COC_UNIFORM_ERROR_TIMEOUT_MS", "", 1);  // set but empty: is_set, and not an integer
  EXPECT_TRUE(env::is_set(v));
  EXPECT_THROW(env::get_int(v), Error);
  ::unsetenv("COC_UNIFORM_ERROR_TIMEOUT_MS");
}

TEST(EnvRegistry, Bool) {
  const auto v = env::Var::kStdoutIsTty;
  ::unsetenv("COC_STDOUT_IS_TTY");
  EXPECT_FALSE(env::get_bool(v));  // default "0"
  for (const char* yes : {"1", "true", "YES", "On"}) {
    ::setenv("COC_STDOUT_IS_TTY", yes, 1);
    EXPECT_TRUE(env::get_bool(v)) << yes;
  }
  ::setenv("COC_STDOUT_IS_TTY", "0", 1);
  EXPECT_FALSE(env::get_bool(v));
  ::unsetenv("COC_STDOUT_IS_TTY");
}

}  // namespace
}  // namespace coc
