#include "coc/comm/error_policy.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>

#include "coc/comm/process.h"
#include "coc/core/env_registry.h"

namespace coc {

int exit_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return 2;
    case ErrorKind::kCorrupt: return 3;
    case ErrorKind::kTimeout: return 4;
    default: return 1;
  }
}

namespace {

bool mpi_usable() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

/// Prints "[rank R] msg" and aborts the job (abort_job, process.h).
[[noreturn]] void report_and_abort(const std::string& msg, int code) {
  const int rank = mpi_usable() ? world_rank() : -1;
  // Rank-local errors often name their rank themselves ("rank 3: ..."): do not print it twice.
  const std::string own = "rank " + std::to_string(rank) + ": ";
  const char* text = msg.rfind(own, 0) == 0 ? msg.c_str() + own.size() : msg.c_str();
  std::fflush(stdout);
  std::fprintf(stderr, "coc: error: [rank %d] %s\n", rank, text);
  std::fflush(stderr);
  abort_job(code);
}

/// True when every rank reaches this point within the deadline: the check that a "uniform" error really was seen
/// by all ranks. Polls with 1 ms sleeps rather than spinning: the peers may still be computing on this core.
bool all_ranks_arrive(std::chrono::milliseconds timeout) {
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS) return false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int flag = 0;
    if (MPI_Test(&req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (flag) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;  // the request is abandoned: we abort next
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int uniform_exit(const Error& e) {
  const int code = exit_code(e.kind());
  if (!mpi_usable()) {
    std::fprintf(stderr, "coc: error: %s\n", e.what());
    return code;
  }
  std::fflush(stdout);
  const auto timeout = std::chrono::milliseconds(env::get_int(env::Var::kUniformErrorTimeoutMs));
  if (!all_ranks_arrive(timeout))
    report_and_abort(std::string(e.what()) +
                         " (not every rank reported this error within COC_UNIFORM_ERROR_TIMEOUT_MS; aborting the job)",
                     code);
  if (world_rank() == 0) std::fprintf(stderr, "coc: error: %s\n", e.what());
  std::fflush(stderr);
  MPI_Finalize();
  return code;
}

}  // namespace

int run_with_error_policy(const std::function<int()>& body) {
  try {
    const int rc = body();
    std::fflush(stdout);
    if (mpi_usable()) MPI_Finalize();
    return rc;
  } catch (const Error& e) {
    if (e.uniform()) {
      try {
        return uniform_exit(e);
      } catch (const std::exception& e2) {  // e.g. a malformed COC_UNIFORM_ERROR_TIMEOUT_MS
        report_and_abort(std::string(e.what()) + "; while reporting it: " + e2.what(), exit_code(e.kind()));
      }
    }
    report_and_abort(e.what(), exit_code(e.kind()));
  } catch (const std::exception& e) {
    report_and_abort(e.what(), 1);
  } catch (...) {
    report_and_abort("unknown exception (not derived from std::exception)", 1);
  }
}

}  // namespace coc
