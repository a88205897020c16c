// Fused all_gather_matmul[_v2] (fused_ops.h): out[m, n] = AG_T(a) · W + bias, and with v2 gathered = AG_T(a), over
// node-shared memory. MindSpeed: the fused lcoc all_gather_matmul[_v2] / MC2 column forward and row backward.
//
// Rank p copies its share a_p [m_p, k] into its segment once, in pieces of R rows, setting flag 1+j after piece j.
// Non-deterministic: every rank GEMMs its own rows straight from `a` (nothing to wait for), then the peers' pieces
// in order p = r+1, r+2, …, each straight from the peer's segment as soon as its flag is set: the gathered input
// is never copied unless v2 asks for it. Deterministic: the rows are computed in the chunked path's fixed 128-row
// tiles of the full matrix (a tile may span two ranks' shares), so pieces are first copied into a dense gathered
// buffer and each tile is multiplied once all of its pieces are there; the output then matches the chunked
// deterministic path bitwise. bf16 wire (CocOptions::comm_dtype): the pieces are rounded to bf16 as they are
// published, and this rank's own rows are taken from its published copy, so the GEMM and v2's gathered input see
// the values the chunked bf16 op sends (4-byte elements in node-shared memory).
#include <algorithm>
#include <cstring>

#include "coc/core/error.h"
#include "fused_internal.h"

namespace coc::detail {

bool fused_all_gather_matmul(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                             MatrixView out, const float* bias, MatrixView* gathered, const CocOptions& opts,
                             CocStats& st) {
  const int T = group.size(), me = group.rank();
  const int64_t m = out.rows, k = a.cols, n = weight_n(w, layout);
  const int64_t R = fused_tile_rows(m, T, opts.deterministic);
  const int64_t max_share = split_rows(m, T, 0).count;
  const int64_t pieces = (max_share + R - 1) / R;
  const char* op = gathered ? "all_gather_matmul_v2" : "all_gather_matmul";
  const std::string what = op_label(op, opts, me) + " (fused)";
  ShmWindow& win = group.shm_window();
  if (!win.ensure(pieces, max_share * k * 4, what)) return false;
  log_fused(group, op, m, k, n, R, opts);
  const RowRange share = split_rows(m, T, me);
  auto copy_block = [k](const float* src, int64_t src_ld, int64_t rows, MatrixView dst) {
    for (int64_t i = 0; i < rows; ++i) std::memmove(dst.row(i), src + i * src_ld, static_cast<size_t>(k) * 4);
  };
  guard_window(win, [&] {
    const uint64_t gen = win.begin_op(what);
    // Publish this rank's share, piece by piece.
    float* mine = win.data(me);
    for (int64_t j = 0; j * R < share.count; ++j) {
      const int64_t rows = std::min(R, share.count - j * R);
      for (int64_t i = 0; i < rows; ++i)
        std::memcpy(mine + (j * R + i) * k, a.row(j * R + i), static_cast<size_t>(k) * 4);
      round_partial(opts, mine + j * R * k, rows * k);
      win.set_flag(1 + j, gen);
      maybe_inject_kill();
    }
    // This rank's rows as the GEMM and the gathered copy take them: the bf16 values a bf16 wire would send.
    const ConstMatrixView own = wire16(opts) ? ConstMatrixView{mine, share.count, k, k} : a;
    auto wait_piece = [&](int r, int64_t j) {
      Stopwatch sw;
      win.wait_flag(r, 1 + j, gen, what + fmt::format(" piece {} of rank {}'s share", j + 1, r));
      st.comm_wait_s += sw.seconds();
    };
    if (!opts.deterministic) {
      {
        Stopwatch sw;
        matmul(own, w, layout, out.slice_rows(share.begin, share.count));
        if (bias) add_bias(out.slice_rows(share.begin, share.count), bias);
        st.gemm_s += sw.seconds();
        if (gathered) copy_block(own.data, own.ld, share.count, gathered->slice_rows(share.begin, share.count));
      }
      for (int j = 1; j < T; ++j) {
        const int p = (me + j) % T;
        const RowRange ps = split_rows(m, T, p);
        for (int64_t q = 0; q * R < ps.count; ++q) {
          const int64_t rows = std::min(R, ps.count - q * R);
          wait_piece(p, q);
          const ConstMatrixView src{win.data(p) + q * R * k, rows, k, k};
          MatrixView y = out.slice_rows(ps.begin + q * R, rows);
          Stopwatch sw;
          matmul(src, w, layout, y);
          if (bias) add_bias(y, bias);
          st.gemm_s += sw.seconds();
          if (gathered) copy_block(src.data, k, rows, gathered->slice_rows(ps.begin + q * R, rows));
        }
      }
    } else {
      // Dense [m, k] gathered input: the caller's when it is dense, else a scratch.
      Scratch g_buf;
      MatrixView g;
      if (gathered && is_contiguous(*gathered)) {
        g = *gathered;
      } else {
        g_buf = make_scratch(m * k);
        g = dense(g_buf.get(), m, k);
      }
      std::vector<std::vector<char>> have(static_cast<size_t>(T));
      for (int r = 0; r < T; ++r) have[static_cast<size_t>(r)].assign(static_cast<size_t>(pieces), 0);
      copy_block(own.data, own.ld, share.count, g.slice_rows(share.begin, share.count));
      std::fill(have[static_cast<size_t>(me)].begin(), have[static_cast<size_t>(me)].end(), 1);
      const int64_t tiles = (m + kDeterministicTileRows - 1) / kDeterministicTileRows;
      // Tiles inside this rank's share first (no waiting), then the others in rank order starting after me.
      std::vector<int64_t> order;
      for (int j = 0; j < T; ++j) {
        const RowRange s = split_rows(m, T, (me + j) % T);
        if (s.count == 0) continue;
        for (int64_t t = s.begin / kDeterministicTileRows; t <= (s.end() - 1) / kDeterministicTileRows; ++t)
          if (std::find(order.begin(), order.end(), t) == order.end()) order.push_back(t);
      }
      COC_ASSERT(static_cast<int64_t>(order.size()) == tiles, "{} tiles ordered of {}", order.size(), tiles);
      for (int64_t t : order) {
        const int64_t b = t * kDeterministicTileRows, e = std::min(m, b + kDeterministicTileRows);
        for (int r = 0; r < T; ++r) {
          const RowRange s = split_rows(m, T, r);
          const int64_t lo = std::max(b, s.begin), hi = std::min(e, s.end());
          for (int64_t q = lo < hi ? (lo - s.begin) / R : 0; lo < hi && q <= (hi - 1 - s.begin) / R; ++q) {
            char& h = have[static_cast<size_t>(r)][static_cast<size_t>(q)];
            if (h) continue;
            wait_piece(r, q);
            const int64_t rows = std::min(R, s.count - q * R);
            copy_block(win.data(r) + q * R * k, k, rows, g.slice_rows(s.begin + q * R, rows));
            h = 1;
          }
        }
        MatrixView y = out.slice_rows(b, e - b);
        Stopwatch sw;
        matmul(g.slice_rows(b, e - b), w, layout, y);
        if (bias) add_bias(y, bias);
        st.gemm_s += sw.seconds();
      }
      if (gathered && !is_contiguous(*gathered)) copy_rows(g, *gathered);
      st.chunks = tiles;
    }
    win.end_op(gen);
  });
  if (!opts.deterministic) st.chunks = T * pieces;
  return true;
}

}  // namespace coc::detail
