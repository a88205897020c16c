// Fused matmul_reduce_scatter (fused_ops.h): out[m_r, n] = rows split_rows(m, T, r) of Σ_ranks a·W, + bias, over
// node-shared memory. MindSpeed: the fused lcoc matmul_reduce_scatter / MC2 row forward; the reduction scheme is
// the owner-reduces one of DeepSpeed's shm all-reduce, applied to GEMM tiles as they are produced.
//
// Rank p's segment holds its partial product P_p [m, n] (dense, ld = n), computed in row tiles of R rows of the
// full matrix (tile t = rows [t·R, t·R + R)); flag slot 1+t is set to the call's generation once tile t is there.
// The tiles are computed in steps: in step i, rank r computes tile i of rank r+1's share, of r+2's, …, then tile i
// of its own share, and right away waits for the peers' flags of that tile and sums rows share ∩ tile from all T
// segments, in rank order, into `out` (+ bias). Outside deterministic mode a tile wholly inside r's share is not
// computed into r's segment: r sums the peers' partials into `out` (+ bias) and the GEMM adds its own product
// there (accumulate_tile below). Every rank computes tile i of r's share in its step i, just before
// r needs it, so r reads the peers' partials while they are still in the shared L3 cache, not from DRAM. A reduce
// in step i waits only on computes of steps <= i, and computes never wait: no cycle.
// Bytes moved per rank: the reads of (T−1)·m_r·n peer floats; no send/receive copies.
// bf16 wire (CocOptions::comm_dtype): each partial tile is rounded to bf16 in the window and every tile takes the
// rank-ordered sum, rounded once before the bias: the bits of the deterministic chunked bf16 op. The window still
// holds 4-byte elements (node-shared memory, not a link).
#include "coc/core/error.h"
#include "fused_internal.h"

namespace coc::detail {

bool fused_matmul_reduce_scatter(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                                 MatrixView out, const float* bias, const CocOptions& opts, CocStats& st) {
  const int T = group.size(), me = group.rank();
  const int64_t m = a.rows, n = weight_n(w, layout);
  const int64_t R = fused_tile_rows(m, T, opts.deterministic);
  const int64_t tiles = (m + R - 1) / R;
  const std::string what = op_label("matmul_reduce_scatter", opts, me) + " (fused)";
  ShmWindow& win = group.shm_window();
  if (!win.ensure(tiles, m * n * 4, what)) return false;
  log_fused(group, "matmul_reduce_scatter", m, a.cols, n, R, opts);
  guard_window(win, [&] {
    const uint64_t gen = win.begin_op(what);
    float* mine = win.data(me);
    std::vector<char> done(static_cast<size_t>(tiles), 0);
    auto compute = [&](int64_t t) {
      if (done[static_cast<size_t>(t)]) return;
      const int64_t b = t * R, rows = std::min(R, m - b);
      Stopwatch sw;
      matmul(a.slice_rows(b, rows), w, layout, dense(mine + b * n, rows, n));
      round_partial(opts, mine + b * n, rows * n);
      st.gemm_s += sw.seconds();
      win.set_flag(1 + t, gen);
      done[static_cast<size_t>(t)] = 1;
      maybe_inject_kill();
    };
    auto tiles_of = [&](int r) {
      const RowRange s = split_rows(m, T, r);
      return s.count == 0 ? RowRange{0, 0} : RowRange{s.begin / R, (s.end() - 1) / R - s.begin / R + 1};
    };
    const RowRange share = split_rows(m, T, me);
    const RowRange tr = tiles_of(me);
    int64_t steps = 0;
    for (int r = 0; r < T; ++r) steps = std::max(steps, tiles_of(r).count);
    std::vector<const float*> parts(static_cast<size_t>(T));
    // out[b..e) = Σ_peers P_r (+ bias), then += a·W by the GEMM itself (beta = 1). OpenBLAS zeroes C before a
    // beta = 0 GEMM and then reads it back, so accumulating costs the GEMM nothing extra; against computing our
    // partial into the segment and summing all T parts, this saves a zeroing pass, a write and a read of our
    // partial per row. The sum is then (Σ_peers) + ours, not rank order: deterministic mode keeps sum_parts.
    auto accumulate_tile = [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        int np = 0;
        for (int r = 0; r < T; ++r)
          if (r != me) parts[static_cast<size_t>(np++)] = win.data(r) + i * n;
        sum_parts(parts.data(), np, n, bias, out.row(i - share.begin), nullptr);
      }
      Stopwatch sw;
      matmul(a.slice_rows(b, e - b), w, layout, out.slice_rows(b - share.begin, e - b), /*accumulate=*/true);
      st.gemm_s += sw.seconds();
      maybe_inject_kill();
    };
    for (int64_t i = 0; i < steps; ++i) {
      for (int j = 1; j < T; ++j) {
        const RowRange pr = tiles_of((me + j) % T);
        if (i < pr.count) compute(pr.begin + i);
      }
      if (i >= tr.count) continue;
      const int64_t t = tr.begin + i;
      const int64_t b = std::max(t * R, share.begin), e = std::min(t * R + R, share.end());
      // A tile wholly inside our share is read by nobody else: outside deterministic mode it skips our segment.
      // A bf16 wire rounds each partial before the sum, which the accumulating GEMM would not.
      const bool accumulate = !opts.deterministic && !wire16(opts) && b == t * R && e == std::min(t * R + R, m);
      if (!accumulate) compute(t);
      Stopwatch sw;
      for (int r = 0; r < T; ++r)
        if (r != me) win.wait_flag(r, 1 + t, gen, what + fmt::format(" tile {}/{}", t + 1, tiles));
      st.comm_wait_s += sw.seconds();
      if (accumulate) {
        accumulate_tile(b, e);
        continue;
      }
      for (int64_t i = b; i < e; ++i) {
        for (int r = 0; r < T; ++r) parts[static_cast<size_t>(r)] = win.data(r) + i * n;
        sum_parts(parts.data(), T, n, bias, out.row(i - share.begin), nullptr, wire16(opts));
      }
    }
    win.end_op(gen);
  });
  st.chunks = tiles;
  return true;
}

}  // namespace coc::detail
