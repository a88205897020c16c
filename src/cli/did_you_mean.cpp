// The nearest known flag to a mistyped one (cli/did_you_mean.h).
#include "cli/did_you_mean.h"

#include <algorithm>
#include <vector>

namespace coc::cli {

size_t edit_distance(const std::string& a, const std::string& b) {
  // One row of the dynamic-programming table at a time (Wagner–Fischer).
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string nearest_flag(const CLI::App& app, const std::string& flag) {
  std::string best;
  size_t best_d = std::max<size_t>(2, flag.size() / 5) + 1;
  for (const CLI::Option* opt : app.get_options())
    for (const std::string& l : opt->get_lnames()) {
      const size_t d = edit_distance(flag, "--" + l);
      if (d < best_d) best_d = d, best = "--" + l;
    }
  return best;
}

}  // namespace coc::cli
