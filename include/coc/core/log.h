// Rank-prefixed logging to stderr. Verbosity is process-wide and set once by the CLI (--verbose).
#pragma once

#include <fmt/format.h>

#include <string>

namespace coc::log {

/// 0 = quiet (warnings and errors only), 1 = info, 2 = verbose (schedules, per-op timing), 3 = debug.
void set_level(int level);
int level();
/// World rank printed in front of every line; -1 before MPI is up.
void set_rank(int rank);
int rank();

void write(int level, const std::string& msg);

template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... a) {
  if (level() >= 1) write(1, fmt::format(f, std::forward<Args>(a)...));
}
template <typename... Args>
void verbose(fmt::format_string<Args...> f, Args&&... a) {
  if (level() >= 2) write(2, fmt::format(f, std::forward<Args>(a)...));
}
template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... a) {
  if (level() >= 3) write(3, fmt::format(f, std::forward<Args>(a)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... a) {
  write(0, "warning: " + fmt::format(f, std::forward<Args>(a)...));
}

}  // namespace coc::log
