// See coc/core/progress_bar.h.
#include "coc/core/progress_bar.h"

#include <unistd.h>

#include "coc/core/env_registry.h"

namespace coc {

std::string progress_bar(int64_t done, int64_t total, int width) {
  if (width < 1) width = 1;
  if (done < 0) done = 0;
  if (total > 0 && done > total) done = total;
  const int filled = total > 0 ? static_cast<int>(static_cast<double>(width) * done / total) : width;
  std::string bar(static_cast<size_t>(filled), '=');
  if (filled < width) bar += '>' + std::string(static_cast<size_t>(width - filled - 1), ' ');
  return "[" + bar + "]";
}

bool is_terminal(int fd) {
  if (env::get(env::Var::kTerm) == "dumb") return false;
  // Open MPI gives ranks a pseudo-terminal even when mpirun's own output is a pipe, so isatty() lies in a rank:
  // scripts/launch passes the truth in COC_STDOUT_IS_TTY. Under a bare mpirun nothing tells, and a log full of
  // progress-bar escapes is worse than no bar, so none.
  if (env::is_set(env::Var::kStdoutIsTty)) return env::get_bool(env::Var::kStdoutIsTty);
  if (env::is_set(env::Var::kOmpiCommWorldSize)) return false;
  return ::isatty(fd) == 1;
}

}  // namespace coc
