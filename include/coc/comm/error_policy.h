// The job-wide error policy: how an exception on one rank ends the whole MPI job (edge case 18 of docs/edge-cases.md:
// "one rank throws and the others hang" must never happen).
//
//  - A uniform coc::Error (bad flags or config, a collective fingerprint mismatch: every rank raises the same
//    error at the same point) is printed once, by rank 0, as "coc: error: <msg>". Every rank then finalizes MPI
//    and returns the kind's exit code, so a user error reads as one line, not as N copies and an abort banner.
//    "Uniform" is a claim made by the thrower; it is checked: the ranks meet in a non-blocking barrier, and a
//    rank whose peers do not arrive within COC_UNIFORM_ERROR_TIMEOUT_MS (default 10 s) treats the error as
//    non-uniform (a rank-local error must never hang in MPI_Finalize waiting for peers stuck in a collective).
//  - Any other error (a non-uniform coc::Error, std::exception, anything else) is printed by the rank that hit it
//    as "coc: error: [rank R] <msg>", and that rank calls MPI_Abort, which kills every rank of the job within
//    seconds: peers blocked in a collective with that rank cannot finish on their own.
#pragma once

#include <functional>

#include "coc/core/error.h"

namespace coc {

/// Process exit code for an error kind: kInvalidArgument 2, kCorrupt 3, kTimeout 4, everything else 1
/// (documented for users in docs/errors.md; scripts test on these values).
int exit_code(ErrorKind kind);

/// Runs `body` (one CLI subcommand, after MPI_Init) under the policy above and returns the process exit code:
/// body's return value on success, exit_code(kind) for a uniform error. MPI is finalized when this returns; on a
/// non-uniform error it does not return (MPI_Abort). Requires MPI to be initialized; MPI calls made here use
/// MPI_COMM_WORLD because the policy is about the whole job, and the body's communicators are gone by then.
/// Output goes to stderr (errors) after stdout is flushed, so a partial result is not lost.
int run_with_error_policy(const std::function<int()>& body);

}  // namespace coc
