// coc: entry point. Brings MPI up, parses the command line, runs one subcommand, and applies the error policy:
// a uniform error (bad flags/config, seen identically by every rank) is printed once by rank 0 as one line and
// every rank exits with code 2; any other error is printed with its rank and the job is aborted with MPI_Abort
// so that no peer hangs (edge case 18).
#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"
#include "coc/core/error.h"
#include "coc/core/log.h"

namespace {
int exit_code(coc::ErrorKind k) {
  switch (k) {
    case coc::ErrorKind::kInvalidArgument: return 2;
    case coc::ErrorKind::kCorrupt: return 3;
    case coc::ErrorKind::kTimeout: return 4;
    default: return 1;
  }
}
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  // SERIALIZED is all coc needs: every MPI call goes through the progress engine's mutex (progress_engine.h).
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  coc::log::set_rank(rank);

  CLI::App app{"coc: communication over computation. Megatron-style tensor/sequence-parallel training on CPU "
               "clusters over MPI, with collectives hidden behind GEMMs (MindSpeed's CoC, for CPUs)."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("coc ") + COC_VERSION);
  std::vector<std::pair<std::string, coc::cli::Runner>> cmds;
  cmds.emplace_back("train", coc::cli::add_train_command(app));
  cmds.emplace_back("check", coc::cli::add_check_command(app));
  cmds.emplace_back("env", coc::cli::add_env_command(app));

  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      int code = 0;
      if (rank == 0) code = app.exit(e);
      else code = e.get_exit_code();
      MPI_Finalize();
      return code;
    }
    int rc = 0;
    for (auto& [name, run] : cmds)
      if (app.got_subcommand(name)) rc = run();
    MPI_Finalize();
    return rc;
  } catch (const coc::Error& e) {
    if (e.uniform()) {
      if (rank == 0) std::fprintf(stderr, "coc: error: %s\n", e.what());
      std::fflush(stderr);
      MPI_Finalize();
      return exit_code(e.kind());
    }
    std::fprintf(stderr, "coc: error: [rank %d] %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, exit_code(e.kind()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coc: error: [rank %d] %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 1;
}
