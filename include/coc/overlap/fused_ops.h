// The fused on-node kernels (--coc-fused-kernel, --use-mc2): the four ops of docs/semantics.md §3 as one routine over
// node-local shared memory, the CPU counterpart of MindSpeed's fused lcoc kernels and Ascend MC2
// (mindspeed/core/tensor_parallel/lcal_coc/ "fused" mode; mindspeed/core/tensor_parallel/mc2_*). They are reached
// through the coc_ops.h functions with CocOptions::fused = true, which run them when fused_unavailable_reason() is
// empty and fall back to the chunked pipeline otherwise (counted in CocStats::fused_fallbacks, explained with -v).
//
// How they work (T ranks sharing one node, a ShmWindow with one segment per rank; docs/design.md, "Fused kernels"):
//  - matmul_reduce_scatter: each rank GEMMs row tiles of its partial product straight into its own segment,
//    publishing a flag per tile; rank r GEMMs the peers' row blocks first and its own block last, and reduces each
//    of its own tiles from every rank's segment (rank order 0..T−1, fp32) into `out` right after computing it, while
//    the tile is still in cache. No collective copy: the only data movement is the owner's reads.
//  - matmul_all_reduce: the same, with tile ownership in contiguous blocks; the owner writes each reduced tile to
//    `out` and back over its own partial, flags it, and every other rank copies it from there.
//  - all_gather_matmul[_v2]: each rank copies its a-share into its segment once, flagging each piece; then GEMMs its
//    own rows from `a` and each peer's pieces straight from the peer's segment as they become ready (v2 also copies
//    them into `gathered`).
// Deterministic mode: the chunked path's tiles and rank-ordered sums (docs/design.md, "Deterministic mode"), so the
// result equals the chunked deterministic one bitwise. Otherwise tiles may be larger (fewer GEMM calls).
#pragma once

#include <cstdint>
#include <string>

#include "coc/comm/communicator.h"

namespace coc {

/// Empty when the fused kernels can run on `tp`: T > 1 and every rank on this node. Otherwise why not ("ranks span
/// nodes", "the window could not be allocated"). Collective on the first call for a communicator (it creates the
/// communicator's ShmWindow, see Communicator::shm_window); identical on every rank.
std::string fused_unavailable_reason(Communicator& group);

/// In-place all-reduce (sum) of buf[0, count) fp32 over `comm`'s node-shared window: every rank copies the slices
/// the others own into its segment, each owner sums its slices in rank order (so the result is deterministic and
/// equal to all_reduce_rows(..., deterministic = true)) into its buffer and its segment, and every rank copies the
/// owners' results back. Slices are 128 KiB to 4 MiB (about 8 per rank) and the three steps are interleaved, so
/// data read by a peer is still in the shared cache. Same count on every rank. DeepSpeed's / xFasterTransformer's
/// shm all-reduce scheme.
/// Errors: uniform kInvalidArgument when the fused path is unavailable on `comm` (spans nodes; check
/// fused_unavailable_reason first) or /dev/shm is too small; kTimeout when a peer does not arrive in time.
void shm_all_reduce(Communicator& comm, float* buf, int64_t count, const std::string& tag = "shm_all_reduce");

}  // namespace coc
