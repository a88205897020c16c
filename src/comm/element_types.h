// The element types of coc's collectives in MPI's terms, and coc's own reductions of 16-bit values.
//
// Terms: "16-bit" is bf16 or fp16 (coc/core/dtype.h). MPI has no sum of either, so coc gives MPI a user-defined
// MPI_Op (MPI 4.0 §6.9.5) over a 2-byte datatype of its own: for each pair of messages MPI combines, the op converts
// both to fp32, adds (or takes the max or min) and rounds once. With T ranks, MPI's algorithms combine T - 1 times
// per element, so a 16-bit MPI reduction rounds up to T - 1 times; at T = 2 that is one rounding, the same bits as
// an fp32 sum rounded at the end. coc's point-to-point reduce-scatter instead receives the T partials whole and
// sums them in fp32 in rank order, rounding once, whatever T (sum_partials_in_rank_order).
#pragma once

#include <mpi.h>

#include <cstdint>

#include "coc/comm/communicator.h"
#include "coc/core/dtype.h"

namespace coc::detail {

/// MPI_FLOAT for fp32; for bf16 and fp16, a 2-byte datatype of coc's (a committed duplicate of MPI_UINT16_T, one
/// per format, so that the user-defined op can tell them apart). Created on first use, which must be on the thread
/// that calls MPI (inside ProgressEngine::call).
MPI_Datatype mpi_type(DType t);
/// MPI's own op for fp32 (and for the integer metadata types, which pass kF32); coc's user-defined op for a 16-bit
/// type (see the top of this file).
MPI_Op mpi_op(ReduceOp op, DType t);

/// out[i] = sum over r = 0..T-1, in that order, of partial r's element i, accumulated in fp32 and rounded once to
/// `t`. Partial `me` is `own`; the others are the consecutive slots of `parts` ([T-1, count] elements of `t`, rank
/// order, `me` skipped). `out` may be `own`.
void sum_partials_in_rank_order(DType t, const void* parts, const void* own, int me, int T, int64_t count,
                                void* out);

}  // namespace coc::detail
