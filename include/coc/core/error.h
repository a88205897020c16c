// Error types and check macros used by every layer.
//
// Policy (docs/errors.md): every error names the rank, the op, the shapes and the fix. An error that every rank
// detects identically (bad flags, config, a collective fingerprint mismatch) is "uniform": rank 0 prints it once
// and all ranks exit cleanly with code 2. Any other error aborts the whole job with MPI_Abort so that no peer is
// left waiting (edge case 18 of docs/edge-cases.md). Modelled on NCCL's error macros, which prepend the call site.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace coc {

/// What went wrong; selects the exit code and how the CLI reports it.
enum class ErrorKind {
  kInvalidArgument,  ///< bad shapes, flags or config: the user must change the input
  kComm,             ///< an MPI call failed or ranks disagree on a collective
  kTimeout,          ///< a collective did not finish before its deadline
  kIo,               ///< a file could not be read or written
  kCorrupt,          ///< a checkpoint or data file failed validation
  kInternal,         ///< a bug in coc
};

/// The one exception type coc throws. `uniform()` is true when every rank raises the same error at the same
/// point, so the CLI may report it once and exit without MPI_Abort.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, bool uniform = false)
      : std::runtime_error(std::move(message)), kind_(kind), uniform_(uniform) {}
  ErrorKind kind() const noexcept { return kind_; }
  bool uniform() const noexcept { return uniform_; }

 private:
  ErrorKind kind_;
  bool uniform_;
};

/// Throws a uniform kInvalidArgument error. Use for checks on inputs every rank sees identically.
template <typename... Args>
[[noreturn]] void throw_invalid(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(ErrorKind::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...), /*uniform=*/true);
}

/// Throws an error of the given kind that only this rank may have hit.
template <typename... Args>
[[noreturn]] void throw_error(ErrorKind kind, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(kind, fmt::format(f, std::forward<Args>(args)...), /*uniform=*/false);
}

}  // namespace coc

/// Internal invariant: a failure is a bug in coc. Adds file:line so the log reads like a stack trace.
#define COC_ASSERT(cond, ...)                                                                               \
  do {                                                                                                       \
    if (!(cond))                                                                                             \
      throw ::coc::Error(::coc::ErrorKind::kInternal,                                                        \
                         ::fmt::format("internal error at {}:{}: {} ({})", __FILE__, __LINE__, #cond,       \
                                       ::fmt::format(__VA_ARGS__)));                                         \
  } while (0)
