// Shared pieces of the fused kernels (fused_internal.h): availability, the tiling rule, the rank-ordered tile sum,
// the verbose line and the test-only failure injection.
#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <string_view>

#include "coc/core/bf16.h"
#include "coc/core/env_registry.h"
#include "coc/core/log.h"
#include "coc/runtime/tracer.h"
#include "coc/overlap/fused_ops.h"
#include "fused_internal.h"

namespace coc {

std::string fused_unavailable_reason(Communicator& group) {
  if (group.size() == 1) return "tp=1: nothing to communicate";
  return group.shm_window().unavailable_reason();
}

namespace detail {

int64_t fused_tile_rows(int64_t m, int T, bool deterministic) {
  constexpr int64_t kT = kDeterministicTileRows;
  if (deterministic) return kT;
  // One tile per rank's share, in multiples of the deterministic tile (OpenBLAS's blocking likes them). Every GEMM
  // call packs the whole weight again (a 2 MB weight costs ~0.25 ms to pack here), and with the peers working in
  // lockstep the pipeline gains nothing from finer tiles: at LLaMA2-7B attn_out (m 1024, k 128, n 4096, tp 2) the
  // fused all-reduce ran ~0.5 ms faster with 512-row tiles than with 128-row ones, the others no slower.
  const int64_t share = (m + T - 1) / T;
  return std::max<int64_t>(1, (share + kT - 1) / kT) * kT;
}

void sum_parts(const float* const* parts, int T, int64_t n, const float* bias, float* dst, float* dst2, bool round16) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "sum_partials", {"cols", n}, {"parts", T});
  constexpr int64_t kBlock = 1024;  // 4 KiB accumulator: stays in L1 while T parts stream through it
  alignas(64) float acc[kBlock];
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int64_t len = std::min(kBlock, n - j0);
    const float* p0 = parts[0] + j0;
    for (int64_t j = 0; j < len; ++j) acc[j] = p0[j];
    // One part at a time over the block: each element still sees the additions in rank order (the order of
    // sum_in_rank_order, so deterministic results agree bitwise with the chunked path), and the loop vectorises.
    for (int r = 1; r < T; ++r) {
      const float* p = parts[r] + j0;
      for (int64_t j = 0; j < len; ++j) acc[j] += p[j];
    }
    if (round16) round_to_bf16(acc, len);
    if (bias)
      for (int64_t j = 0; j < len; ++j) acc[j] += bias[j0 + j];  // after the reduction, as add_bias does
    std::copy(acc, acc + len, dst + j0);
    if (dst2) std::copy(acc, acc + len, dst2 + j0);
  }
}

void round_partial(const CocOptions& opts, float* rows, int64_t count) {
  if (!wire16(opts)) return;
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "round_bf16", {"elements", count});
  round_to_bf16(rows, count);
}

RowRange owned_tiles(int64_t tiles, int T, int r) { return split_rows(tiles, T, r); }

void maybe_inject_kill() {
  static const int64_t victim = env::get_int(env::Var::kTestFusedKillRank);
  static const int64_t stopped = env::get_int(env::Var::kTestFusedStopRank);
  if (victim >= 0 && victim == log::rank()) {
    log::write(0, fmt::format("COC_TEST_FUSED_KILL_RANK: rank {} kills itself inside a fused kernel", victim));
    std::raise(SIGKILL);
  }
  if (stopped >= 0 && stopped == log::rank()) {
    log::write(0, fmt::format("COC_TEST_FUSED_STOP_RANK: rank {} stops itself inside a fused kernel", stopped));
    std::raise(SIGSTOP);
  }
}

bool use_fused(Communicator& group, const char* op, const CocOptions& opts, CocStats& st) {
  const std::string why = fused_unavailable_reason(group);
  if (why.empty()) {
    st.fused_calls = 1;
    return true;
  }
  st.fused_calls = 0;
  st.fused_fallbacks = 1;
  if (log::level() >= 2 && group.rank() == 0)
    log::verbose("coc {}{}: fused kernel requested but {}; running the chunked pipeline instead", op,
                 opts.tag.empty() ? "" : " '" + opts.tag + "'", why);
  return false;
}

void fused_fallback(Communicator& group, const char* op, const CocOptions& opts, CocStats& st) {
  use_fused(group, op, opts, st);  // the window is now unusable: counts the fallback and logs the reason
}

void log_fused(const Communicator& group, const char* op, int64_t m, int64_t k, int64_t n, int64_t tile_rows,
               const CocOptions& opts) {
  if (log::level() < 2 || group.rank() != 0) return;
  const bool gathers = std::string_view(op).starts_with("all_gather");
  const char* how = opts.deterministic
                        ? (gathers ? "deterministic (fixed 128-row GEMM tiles)"
                                   : "deterministic (fixed 128-row GEMM tiles, rank-ordered sum)")
                        : (gathers ? "non-deterministic (peers' rows multiplied straight from their segments)"
                                   : "non-deterministic (the GEMM accumulates onto the peers' partials)");
  const std::string line =
      fmt::format("coc {}{}: m={} k={} n={} tp={} fused kernel over node-shared memory, {}-row {}, {}", op,
                  opts.tag.empty() ? "" : " '" + opts.tag + "'", m, k, n, group.size(), tile_rows,
                  gathers ? "pieces" : "tiles", how);
  if (first_occurrence(line)) log::verbose("{}", line);
}

}  // namespace detail
}  // namespace coc
