#include "cli/commands.h"

namespace coc::cli {
Runner add_env_command(CLI::App& app) {
  app.add_subcommand("env", "TODO");
  return [] { return 0; };
}
}  // namespace coc::cli
