// "Did you mean --tensor-model-parallel-size?": the known flag nearest to a mistyped one, for the unknown-flag line
// of every subcommand (main.cpp) and the unknown keys of a --config file (train_options.cpp).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace coc::cli {

/// Levenshtein distance between `a` and `b` (insertions, deletions and substitutions of one byte each).
size_t edit_distance(const std::string& a, const std::string& b);

/// The long flag of `app` ("--tensor-model-parallel-size") nearest to `flag` ("--tensor-model-paralel-size") when it
/// is a likely typo: at most 2 edits, or a fifth of the flag's length for long flags; "" when none is that close.
std::string nearest_flag(const CLI::App& app, const std::string& flag);

}  // namespace coc::cli
