#include "cli/commands.h"

namespace coc::cli {
Runner add_check_command(CLI::App& app) {
  app.add_subcommand("check", "TODO");
  return [] { return 0; };
}
}  // namespace coc::cli
