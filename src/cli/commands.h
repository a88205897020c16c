// The coc subcommands. Each add_*_command registers its flags on `app` and returns the function that runs it
// (after MPI is up). Errors are thrown as coc::Error and reported by main (docs/errors.md).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace coc::cli {

using Runner = std::function<int()>;

Runner add_train_command(CLI::App& app);
Runner add_check_command(CLI::App& app);
Runner add_env_command(CLI::App& app);
Runner add_bench_command(CLI::App& app);
/// `coc tune`: the overlap switches walked one at a time (tune.h).
Runner add_tune_command(CLI::App& app);
/// `coc analyze`: reads trace files on one process and never touches MPI; main runs it without MPI_Init.
Runner add_analyze_command(CLI::App& app);
/// `coc plot`: draws `coc train --log-json` files; MPI-free like analyze.
Runner add_plot_command(CLI::App& app);
/// `coc preprocess` and `coc convert`: file tools on one process, run without MPI_Init like analyze.
Runner add_preprocess_command(CLI::App& app);
Runner add_convert_command(CLI::App& app);

}  // namespace coc::cli
