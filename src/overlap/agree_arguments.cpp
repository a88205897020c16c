// Argument agreement across the TP group before a CoC op posts anything (--debug-collectives).
//
// Without it, a rank that passes a different m (or rejects its own arguments) desynchronises the chunk loop: the
// peers post chunk collectives it never posts, and the job hangs until the deadline. PyTorch c10d's
// ProcessGroupWrapper checks each collective's fingerprint; checking the op's whole shape once, up front, also
// catches the cases where the first chunks happen to have equal sizes.
#include <fmt/format.h>

#include "coc/core/error.h"
#include "coc_internal.h"

namespace coc::detail {

void agree_on_arguments(Communicator& group, const std::string& label, const std::string& err,
                        std::span<const int64_t> key, const std::string& key_desc) {
  if (group.size() > 1 && group.options().check_fingerprints) {
    const uint8_t ok = err.empty() ? 1 : 0;
    uint64_t h = fnv1a(key.data(), key.size_bytes());
    h = fnv1a(&ok, 1, h);
    try {
      group.check_same(h, fmt::format("the arguments of {} ({}, arguments {}; every rank of the TP group must pass "
                                      "the same values)",
                                      label, key_desc, ok ? "valid" : "rejected"));
    } catch (const Error&) {
      // A rank with its own complaint reports that one (it is the more useful message); the others report the
      // disagreement, which names the first differing rank. Both are uniform: every rank throws here.
      if (!err.empty()) throw Error(ErrorKind::kInvalidArgument, label + ": " + err, /*uniform=*/true);
      throw;
    }
  }
  if (!err.empty()) throw Error(ErrorKind::kInvalidArgument, label + ": " + err, /*uniform=*/true);
}

}  // namespace coc::detail
