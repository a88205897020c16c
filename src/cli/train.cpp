#include "cli/commands.h"

namespace coc::cli {
Runner add_train_command(CLI::App& app) {
  app.add_subcommand("train", "TODO");
  return [] { return 0; };
}
}  // namespace coc::cli
