// See coc/core/progress_bar.h.
#include "coc/core/progress_bar.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

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
  const char* term = std::getenv("TERM");
  return ::isatty(fd) == 1 && !(term && std::strcmp(term, "dumb") == 0);
}

}  // namespace coc
