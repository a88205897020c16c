// Report files of the single-process subcommands (`coc analyze`, `coc plot`): written whole or not at all.
#pragma once

#include <string>

namespace coc::cli {

/// Writes `text` to `path` atomically: `<path>.tmp.<pid>`, then rename (as checkpoints are written; errors.md), so
/// that an error never leaves a partial report that looks complete. Throws a uniform kInvalidArgument when `path`
/// is a directory, kIo naming the file when it cannot be written or renamed.
void write_atomically(const std::string& path, const std::string& text);

}  // namespace coc::cli
