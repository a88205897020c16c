// Private pieces of the fused kernels (fused_ops.h): the entry points the CoC ops dispatch to, the rank-ordered
// tile sum, the tiling rule and the test-only failure injection. Not installed; only src/overlap/ includes it.
#pragma once

#include <cstdint>
#include <string>

#include "coc/comm/shm_window.h"
#include "coc_internal.h"

namespace coc::detail {

/// Rows per fused GEMM tile (or all-gather piece) for m rows over T ranks: kDeterministicTileRows in
/// deterministic mode (the chunked path's tiling, so bits agree); otherwise a rank's share rounded up to a multiple
/// of it (fewest GEMM calls: each one packs the whole weight again). Identical on every rank.
int64_t fused_tile_rows(int64_t m, int T, bool deterministic);

/// dst[j] = (((parts[0][j] + parts[1][j]) + …) + parts[T−1][j]) (+ bias[j]) for j < n, also stored to dst2 when
/// set. Rank order and one pass: each part is read once and the output written once (cache blocks of 1024 floats).
/// dst may alias one of the parts (it is read before it is written). `round16` (a bf16 wire) rounds the sum to bf16
/// before the bias, as the chunked bf16 ops do (the sum of bf16 partials in fp32, rounded once, then the bias).
void sum_parts(const float* const* parts, int T, int64_t n, const float* bias, float* dst, float* dst2,
               bool round16 = false);

/// Under a bf16 wire (CocOptions::comm_dtype), rounds a partial the GEMM just wrote to the window, so that every
/// rank's contribution is the bf16 value the chunked ops would send.
void round_partial(const CocOptions& opts, float* rows, int64_t count);

/// The tiles [begin, end) of `tiles` owned by rank r when tile ownership is in contiguous blocks.
RowRange owned_tiles(int64_t tiles, int T, int r);

/// Test-only (COC_TEST_FUSED_KILL_RANK / COC_TEST_FUSED_STOP_RANK): SIGKILL / SIGSTOP this process mid-op if it is
/// the named world rank, to test that peers waiting on its flags end the job within their deadline (a stopped rank
/// is invisible to mpirun: only the waiter's own deadline can end the job). A no-op when the variables are unset.
void maybe_inject_kill();

/// With opts.fused, T > 1 and m > 0: true when the fused kernel can run on `group` (st.fused_calls = 1); otherwise
/// the call falls back to the chunked pipeline: st.fused_fallbacks = 1 and, with -v, rank 0 of the group says why.
/// Collective the first time for a communicator (creates its ShmWindow).
bool use_fused(Communicator& group, const char* op, const CocOptions& opts, CocStats& st);

/// Records that a call granted by use_fused could not run fused after all (the window could not grow): moves the
/// count from st.fused_calls to st.fused_fallbacks and, with -v, says why.
void fused_fallback(Communicator& group, const char* op, const CocOptions& opts, CocStats& st);

/// Verbose line for a fused call (rank 0 of the group only).
void log_fused(const Communicator& group, const char* op, int64_t m, int64_t k, int64_t n, int64_t tile_rows,
               const CocOptions& opts);

/// The fused implementations; arguments were validated by the coc_ops.h forms, T > 1, m > 0 and the window is
/// usable. They fill st (gemm_s, comm_wait_s, chunks = tiles) and finish the op (bias included) before returning
/// true. They return false, having done nothing, when the window cannot grow to the size the call needs (MPI
/// failed to allocate it; the same on every rank): the caller then falls back (fused_fallback).
bool fused_matmul_all_reduce(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                             MatrixView out, const float* bias, const CocOptions& opts, CocStats& st);
bool fused_matmul_reduce_scatter(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                                 MatrixView out, const float* bias, const CocOptions& opts, CocStats& st);
/// gathered may be null (all_gather_matmul) or [m, k] (v2).
bool fused_all_gather_matmul(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                             MatrixView out, const float* bias, MatrixView* gathered, const CocOptions& opts,
                             CocStats& st);

/// The fused dispatch of run_coc_op: with opts.fused, T > 1 and m > 0, and the fused path available on `group`, runs
/// `kernel` (one of the fused_* entry points, returning false when the window cannot grow) and commits the stats;
/// returns true when the op is done. Otherwise (or when the kernel declines) it records the fallback and returns
/// false, and the caller runs the chunked pipeline. A fused call never counts as a serial fallback.
template <typename Kernel>
bool run_fused_if_requested(Communicator& group, const char* op, int64_t m, const CocOptions& opts, CocStats& st,
                            Kernel&& kernel) {
  if (!opts.fused || group.size() <= 1 || m == 0 || !use_fused(group, op, opts, st)) return false;
  const int64_t saved_fallback = st.serial_fallbacks;
  st.serial_fallbacks = 0;
  if (kernel()) {
    commit_stats(opts, st);
    return true;
  }
  st.serial_fallbacks = saved_fallback;
  fused_fallback(group, op, opts, st);  // the window could not grow: run the chunked pipeline
  return false;
}

/// Runs `body` (a fused op on `win`) and marks the window broken if it throws, so the window is never freed
/// collectively while peers may be dead or stuck.
template <typename F>
void guard_window(ShmWindow& win, F&& body) {
  try {
    body();
  } catch (...) {
    win.mark_broken();
    throw;
  }
}

}  // namespace coc::detail
