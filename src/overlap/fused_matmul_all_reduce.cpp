// Fused matmul_all_reduce (fused_ops.h): out[m, n] = Σ_ranks a·W + bias on every rank, over node-shared memory.
// MindSpeed: the fused lcoc matmul_all_reduce (CoCRowParallelLinearWithAllReduce's kernel); the scheme is
// reduce-scatter ownership then gather, as in DeepSpeed's / xFasterTransformer's shm all-reduce, fed directly by
// the GEMM tiles.
//
// Row tiles of R rows (tile t = rows [t·R, t·R + R)) are owned in contiguous blocks (owned_tiles). Every rank
// GEMMs every tile into its own segment (partial P_p [m, n]) and sets flag 1+t, in steps: in step i, tile i of the
// block of rank r+1, r+2, …, then tile i of its own block, so that every rank computes tile i of r's block just
// before r reduces it and r reads the partials from the shared L3 cache. For each tile it owns, right after
// computing it, the owner waits for the peers' partials and reduces the tile:
// - deterministic mode: it sums them in rank order (+ bias) into `out` and back over its own partial (which
//   nobody else reads);
// - otherwise it skips computing its own partial and adds the other peers' partials and its own product (by a
//   beta = 1 GEMM) in place over the next rank's partial (reduce_in_place below), then copies that (+ bias).
// It then sets flag 1+tiles+t ("reduced"). Every rank copies the tiles it does not own from the segment holding
// them, opportunistically while it still reduces its own, then waiting for the rest. Per rank: (T−1)/T·m·n floats
// read from peers for the reduction, the same again for the gather, and `out` written once.
// bf16 wire (CocOptions::comm_dtype): each partial tile is rounded to bf16 in the window and the owner takes the
// rank-ordered sum, rounded once before the bias: the bits of the deterministic chunked bf16 op. The window still
// holds 4-byte elements (node-shared memory, not a link).
#include <cstring>

#include "coc/core/error.h"
#include "fused_internal.h"

namespace coc::detail {

bool fused_matmul_all_reduce(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                             MatrixView out, const float* bias, const CocOptions& opts, CocStats& st) {
  const int T = group.size(), me = group.rank();
  const int64_t m = a.rows, n = weight_n(w, layout);
  const int64_t R = fused_tile_rows(m, T, opts.deterministic);
  const int64_t tiles = (m + R - 1) / R;
  const std::string what = op_label("matmul_all_reduce", opts, me) + " (fused)";
  ShmWindow& win = group.shm_window();
  if (!win.ensure(2 * tiles, m * n * 4, what)) return false;
  log_fused(group, "matmul_all_reduce", m, a.cols, n, R, opts);
  guard_window(win, [&] {
    const uint64_t gen = win.begin_op(what);
    float* mine = win.data(me);
    std::vector<const float*> parts(static_cast<size_t>(T));
    auto rows_of = [&](int64_t t) { return RowRange{t * R, std::min(R, m - t * R)}; };
    auto compute = [&](int64_t t) {
      const RowRange rr = rows_of(t);
      Stopwatch sw;
      matmul(a.slice_rows(rr.begin, rr.count), w, layout, dense(mine + rr.begin * n, rr.count, n));
      round_partial(opts, mine + rr.begin * n, rr.count * n);
      st.gemm_s += sw.seconds();
      win.set_flag(1 + t, gen);
      maybe_inject_kill();
    };
    // Tiles owned by peers, to be copied once their owner flags them reduced: (owner, tile), in owner order
    // me+1, me+2, … (the order in which the owners finish, roughly).
    std::vector<std::pair<int, int64_t>> to_fetch;
    size_t fetched = 0;
    // Where owner o's reduced tiles end up: outside deterministic mode, in place over the next rank's partial
    // (below); in deterministic mode, over the owner's own partial, bias included.
    const bool in_place = !opts.deterministic && !wire16(opts);  // bf16: each partial is rounded before the sum
    auto holder = [&](int o) { return in_place ? (o + 1) % T : o; };
    auto copy_reduced = [&](int o, int64_t t) {
      const RowRange rr = rows_of(t);
      const float* src = win.data(holder(o)) + rr.begin * n;
      for (int64_t i2 = 0; i2 < rr.count; ++i2) {
        const float* row = src + i2 * n;
        if (in_place && bias)
          sum_parts(&row, 1, n, bias, out.row(rr.begin + i2), nullptr);  // copy + bias
        else
          std::memcpy(out.row(rr.begin + i2), row, static_cast<size_t>(n) * 4);
      }
    };
    auto fetch = [&](size_t i) { copy_reduced(to_fetch[i].first, to_fetch[i].second); };
    // Outside deterministic mode the owner does not compute its own partial of tile t into its segment: it sums
    // the other peers' partials into the next rank's (in place; nothing for T = 2), then lets the GEMM add its own
    // product there (beta = 1: OpenBLAS zeroes C before a beta = 0 GEMM, so accumulating costs the GEMM nothing).
    // That tile is then the reduced one that every rank copies (+ bias): against summing all T partials into
    // `out` and back into the segment, this saves a zeroing pass, a write and two reads per row. The sum order is
    // no longer the rank order, hence deterministic mode keeps that.
    auto reduce_in_place = [&](int64_t t) {
      const RowRange rr = rows_of(t);
      float* dst = win.data(holder(me));
      if (T > 2)
        for (int64_t i = rr.begin; i < rr.end(); ++i) {
          int np = 0;
          for (int r = 0; r < T; ++r)
            if (r != me) parts[static_cast<size_t>(np++)] = win.data(r) + i * n;  // dst aliases one: allowed
          sum_parts(parts.data(), np, n, nullptr, dst + i * n, nullptr);
        }
      Stopwatch sw;
      matmul(a.slice_rows(rr.begin, rr.count), w, layout, dense(dst + rr.begin * n, rr.count, n),
             /*accumulate=*/true);
      st.gemm_s += sw.seconds();
      maybe_inject_kill();
    };
    const RowRange own = owned_tiles(tiles, T, me);
    const int64_t steps = owned_tiles(tiles, T, 0).count;  // block 0 is the largest
    for (int64_t i = 0; i < steps; ++i) {
      for (int j = 1; j < T; ++j) {
        const int o = (me + j) % T;
        const RowRange ot = owned_tiles(tiles, T, o);
        if (i >= ot.count) continue;
        compute(ot.begin + i);
        to_fetch.emplace_back(o, ot.begin + i);
      }
      if (i >= own.count) continue;
      const int64_t t = own.begin + i;
      if (!in_place) compute(t);
      Stopwatch sw;
      for (int r = 0; r < T; ++r)
        if (r != me) win.wait_flag(r, 1 + t, gen, what + fmt::format(" tile {}/{}", t + 1, tiles));
      st.comm_wait_s += sw.seconds();
      if (in_place) {
        reduce_in_place(t);
        win.set_flag(1 + tiles + t, gen);
        copy_reduced(me, t);  // our own reduced tile, too, is copied from the holder's segment (+ bias)
      } else {
        const RowRange rr = rows_of(t);
        for (int64_t i = rr.begin; i < rr.end(); ++i) {
          for (int r = 0; r < T; ++r) parts[static_cast<size_t>(r)] = win.data(r) + i * n;
          sum_parts(parts.data(), T, n, bias, out.row(i), mine + i * n, wire16(opts));
        }
        win.set_flag(1 + tiles + t, gen);
      }
      // Copy whatever the peers have already reduced, while they work on the rest.
      while (fetched < to_fetch.size() &&
             win.test_flag(to_fetch[fetched].first, 1 + tiles + to_fetch[fetched].second, gen))
        fetch(fetched++);
    }
    for (; fetched < to_fetch.size(); ++fetched) {
      const auto [o, t] = to_fetch[fetched];
      Stopwatch sw;
      win.wait_flag(o, 1 + tiles + t, gen, what + fmt::format(" reduced tile {}/{} from its owner", t + 1, tiles));
      st.comm_wait_s += sw.seconds();
      fetch(fetched);
    }
    win.end_op(gen);
  });
  st.chunks = tiles;
  return true;
}

}  // namespace coc::detail
