// Private to src/comm/: turns a failed MPI return code into coc's kComm error, naming the rank, the MPI call and
// what it was for (NCCL's error macros do the same, so a log reads like a stack trace).
#pragma once

#include <mpi.h>

#include <string>

#include "coc/core/error.h"
#include "coc/core/log.h"

namespace coc::detail {

inline void check_mpi(int rc, const char* call, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char err[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, err, &len);
  throw_error(ErrorKind::kComm, "rank {}: {} failed for {}: {}", log::rank(), call, what, std::string(err, len));
}

}  // namespace coc::detail
