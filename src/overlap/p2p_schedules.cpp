// The point-to-point CoC schedules (CocCommAlgo::kP2p) of matmul_reduce_scatter, all_gather_matmul[_v2] and
// matmul_all_reduce: the same results as the collective schedules, in an order that hides more of the link.
//
// Why: with the collective schedules every chunk mixes all ranks' rows, so the first collective waits for a GEMM
// chunk and the last GEMM chunk waits for a collective, and both ends of the pipeline are exposed. With
// point-to-point messages a rank can order its work by who needs it:
//  - reduce-scatter, remote-first: compute the rows that peers own first and send each chunk as soon as it is
//    computed; compute this rank's own rows last, while the sends drain; then sum the partials in rank order.
//  - all-gather, local-first: this rank's own rows need no communication, so they are multiplied first, while the
//    peers' rows arrive; each peer chunk is multiplied as soon as it is in.
// With T ranks, a fraction 1/T of the GEMM thus overlaps communication with no pipeline fill at all (half of it at
// tp = 2). This is the order of PyTorch's async tensor parallelism (torch/distributed/_symmetric_memory,
// fused_all_gather_matmul: "local shard first") and of Flux (Chang et al., 2024, §4); MindSpeed's CoC has no
// equivalent because it drives HCCL collectives. Built from MPI_Isend/MPI_Irecv (Communicator::exchange), which
// also sidesteps Open MPI's slow non-blocking reduce-scatter (feasibility.md).
//
//  - all-reduce: the reduce-scatter above, then each reduced chunk of this rank's rows is sent to every peer as soon
//    as it is summed, while the next own chunk computes (reduce-scatter + all-gather, as ring all-reduces split it,
//    but with each rank's rows kept whole). MPI libraries' TCP all-reduces run 1.5-3x off the wire
//    (feasibility.md); these messages move at link speed, and the gather of chunk i overlaps the GEMM of chunk i+1.
//
// The all-gather posts every receive at once and chains each chunk's sends behind the previous chunk's local send
// completion, advanced by the progress engine (Communicator::exchange's `after`). Posted all at once, MPI
// interleaves the pending sends and every chunk arrives near the end together with the last (measured at 1 Gbit/s:
// the first chunk ~20 ms after the GEMM wanted it); a window advanced by the main thread at GEMM boundaries left
// the link idle between boundaries. Chained on local completion, the next send starts while the socket still
// drains the previous one: chunks arrive in order and the link stays busy (docs/performance.md, point 6).
//
// Deterministic mode: the GEMMs run in the fixed tiles of every deterministic schedule (TileCover, ready_tiles:
// each tile once, when its rows are first needed or have all arrived) and the partials are summed in rank order, so
// the bits are those of the collective schedules for every N.
#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "coc/runtime/tracer.h"
#include "coc_internal.h"

namespace coc::detail {

namespace {
/// y = x · W, timed into st.gemm_s, then one MPI poll (the inline engine moves messages only when called). Measured
/// on the 1 Gbit/s cluster: polling more often (every ~2 ms of GEMM) raised the GEMM slowdown σ from ~0.2 to ~0.3
/// and gained nothing, so one poll per chunk it is.
void matmul_then_poll(Communicator& tp, ConstMatrixView x, ConstMatrixView w, WeightLayout layout, MatrixView y,
                    CocStats& st) {
  Stopwatch sw;
  matmul(x, w, layout, y);
  st.gemm_s += sw.seconds();
  tp.engine()->poll();
}

/// Deterministic mode: the not yet computed tiles covering `rows` of a · W into the full partial `full` ([m, n]),
/// timed into st.gemm_s, then one MPI poll.
void cover_then_poll(Communicator& tp, TileCover& tiles, RowRange rows, ConstMatrixView a, ConstMatrixView w,
                     WeightLayout layout, MatrixView full, CocStats& st) {
  Stopwatch sw;
  tiles.cover(rows, a, w, layout, full);
  st.gemm_s += sw.seconds();
  tp.engine()->poll();
}

/// This rank's partial of its own rows `mine` into `dst` (its slot of parts): one GEMM, or in deterministic mode
/// (`tiles` set) the covering tiles into the full partial `send` ([m, n]) and a copy of the rows.
void own_partial(Communicator& tp, TileCover* tiles, RowRange mine, ConstMatrixView a, ConstMatrixView w,
                 WeightLayout layout, float* send, int64_t n, float* dst, CocStats& st) {
  if (!tiles) {
    matmul_then_poll(tp, a.slice_rows(mine.begin, mine.count), w, layout, dense(dst, mine.count, n), st);
    return;
  }
  cover_then_poll(tp, *tiles, mine, a, w, layout, dense(send, a.rows, n), st);
  copy_rows(dense(send + mine.begin * n, mine.count, n), dense(dst, mine.count, n));
}

/// The remote-first half shared by the reduce-scatter and the all-reduce: for each chunk c, the GEMM of the peers'
/// rows of c into `send` ([m, n], at their row offsets) and one exchange that sends them and receives the peers'
/// partials of this rank's rows of c into parts[from] (parts: [T, share rows, n], this rank's share). With `tiles`
/// (deterministic mode) the GEMMs run in its fixed tiles. Appends one Work per chunk to `works`, which the caller
/// waits for (and drains on error).
void post_remote_first(Communicator& tp, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                       const ChunkPlan& plan, int64_t n, float* send, float* parts, TileCover* tiles, const char* op,
                       const char* what, const CocOptions& opts, CocStats& st, std::vector<Work>& works) {
  const int T = tp.size(), me = tp.rank();
  const RowRange share = plan.share(me);
  const int64_t cnt = share.count * n;
  for (int c = 0; c < plan.chunks(); ++c) {
    std::vector<P2pSend> sends;
    std::vector<P2pRecv> recvs;
    const RowRange mine = plan.sub(me, c);
    for (int s = 1; s < T; ++s) {
      const int to = (me + s) % T, from = (me - s + T) % T;  // a ring order, so that no rank is everyone's target
      const RowRange sub = plan.sub(to, c);
      if (sub.count > 0) {
        if (tiles)
          cover_then_poll(tp, *tiles, sub, a, w, layout, dense(send, plan.m(), n), st);
        else
          matmul_then_poll(tp, a.slice_rows(sub.begin, sub.count), w, layout,
                           dense(send + sub.begin * n, sub.count, n), st);
        sends.push_back({to, send + sub.begin * n, sub.count * n});
      }
      if (mine.count > 0) recvs.push_back({from, parts + from * cnt + (mine.begin - share.begin) * n, mine.count * n});
      tp.engine()->poll();
    }
    works.push_back(tp.exchange(sends, recvs, chunk_tag(op, opts, c, plan.chunks(), plan.chunk_rows(c), n) + what));
  }
}
}  // namespace

void matmul_reduce_scatter_p2p(Communicator& tp, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                               MatrixView out, const float* bias, const ChunkPlan& plan, const CocOptions& opts,
                               CocStats& st) {
  constexpr const char* kOp = "matmul_reduce_scatter";
  const int T = tp.size(), me = tp.rank(), C = plan.chunks();
  const int64_t n = out.cols;
  const RowRange share = plan.share(me);
  const int64_t cnt = share.count * n;
  // parts[r] = rank r's partial of this rank's rows (parts[me]: our own), summed in rank order at the end.
  Scratch parts = make_scratch(T * cnt);
  // Our partials of the peers' rows, at their row offsets in the full matrix (our own rows' slots stay unused,
  // except in deterministic mode, where whole tiles land here).
  Scratch send = make_scratch(plan.m() * n);
  std::optional<TileCover> tiles;
  if (opts.deterministic) tiles.emplace(plan.m());
  TileCover* tc = tiles ? &*tiles : nullptr;
  std::vector<Work> works;
  works.reserve(static_cast<size_t>(C));
  try {
    post_remote_first(tp, a, w, layout, plan, n, send.get(), parts.get(), tc, kOp, "", opts, st, works);
    // Our own rows last, while the sends drain; each chunk is summed once its peers' partials are in.
    for (int c = 0; c < C; ++c) {
      const RowRange mine = plan.sub(me, c);
      if (mine.count == 0) continue;
      const int64_t off = (mine.begin - share.begin) * n;
      own_partial(tp, tc, mine, a, w, layout, send.get(), n, parts.get() + me * cnt + off, st);
      {
        Stopwatch sw;
        works[static_cast<size_t>(c)].wait();
        st.comm_wait_s += sw.seconds();
      }
      sum_in_rank_order(parts.get() + off, T, cnt, out.slice_rows(mine.begin - share.begin, mine.count));
    }
    wait_all(works);  // chunks whose own rows are empty on this rank still carry our sends
  } catch (...) {
    drain_after_error(works, std::current_exception());
    throw;
  }
  if (bias) add_bias(out, bias);
  st.chunks = C;
}

void all_gather_matmul_p2p(Communicator& tp, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                           MatrixView out, const float* bias, MatrixView g, const float* send,
                           const ChunkPlan& plan, const CocOptions& opts, CocStats& st) {
  constexpr const char* kOp = "all_gather_matmul";
  const int T = tp.size(), me = tp.rank(), C = plan.chunks();
  const int64_t k = g.cols;
  const RowRange share = plan.share(me);
  std::vector<Work> works;
  works.reserve(static_cast<size_t>(C));
  auto post = [&](int c) {
    std::vector<P2pSend> sends;
    std::vector<P2pRecv> recvs;
    const RowRange mine = plan.sub(me, c);
    for (int s = 1; s < T; ++s) {
      const int to = (me + s) % T, from = (me - s + T) % T;
      if (mine.count > 0) sends.push_back({to, send + (mine.begin - share.begin) * k, mine.count * k});
      const RowRange sub = plan.sub(from, c);
      if (sub.count > 0) recvs.push_back({from, g.row(sub.begin), sub.count * k});
    }
    // Chunk c's sends follow chunk c-1's (Communicator::exchange's `after`) so that the chunks arrive in order
    // rather than all together at the end; the receives are all posted now. `works` never reallocates (reserved).
    const Work none;
    works.push_back(tp.exchange(sends, recvs, chunk_tag(kOp, opts, c, C, plan.chunk_rows(c), k),
                                c > 0 ? works[static_cast<size_t>(c - 1)] : none));
  };
  auto gemm_rows = [&](ConstMatrixView x, RowRange rows) {
    MatrixView y = out.slice_rows(rows.begin, rows.count);
    matmul_then_poll(tp, x, w, layout, y, st);
    if (bias) add_bias(y, bias);
  };
  // Deterministic mode: the fixed tiles of the gathered matrix, each once all its rows are in; a tile may mix our
  // rows with a peer's, so ours are placed in g first.
  std::vector<std::vector<int64_t>> ready;
  if (opts.deterministic) {
    ready = ready_tiles(plan, me);
    MatrixView own = g.slice_rows(share.begin, share.count);
    if (own.data != send) copy_rows(ConstMatrixView{send, share.count, k, k}, own);
  }
  auto gemm_ready = [&](const std::vector<int64_t>& tiles) {
    for (int64_t t : tiles) {
      const RowRange r = tile_rows(t, plan.m());
      gemm_rows(g.slice_rows(r.begin, r.count), r);
    }
  };
  try {
    for (int c = 0; c < C; ++c) post(c);
    // Our own rows first: they need nothing from the peers.
    if (opts.deterministic) {
      gemm_ready(ready[0]);
    } else {
      for (int c = 0; c < C; ++c) {
        const RowRange mine = plan.sub(me, c);
        if (mine.count > 0) gemm_rows(a.slice_rows(mine.begin - share.begin, mine.count), mine);
      }
    }
    for (int c = 0; c < C; ++c) {
      {
        Stopwatch sw;
        works[static_cast<size_t>(c)].wait();
        st.comm_wait_s += sw.seconds();
      }
      if (opts.deterministic) {
        gemm_ready(ready[static_cast<size_t>(c) + 1]);
        continue;
      }
      for (int s = 1; s < T; ++s) {
        const int from = (me - s + T) % T;
        const RowRange sub = plan.sub(from, c);
        if (sub.count > 0) gemm_rows(g.slice_rows(sub.begin, sub.count), sub);
      }
    }
  } catch (...) {
    drain_after_error(works, std::current_exception());
    throw;
  }
  st.chunks = C;
}

void matmul_all_reduce_p2p(Communicator& tp, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                           MatrixView out, const float* bias, const ChunkPlan& plan, const CocOptions& opts,
                           CocStats& st) {
  constexpr const char* kOp = "matmul_all_reduce";
  const int T = tp.size(), me = tp.rank(), C = plan.chunks();
  const int64_t n = out.cols;
  const RowRange share = plan.share(me);
  const int64_t cnt = share.count * n;
  // MPI receives the peers' reduced rows straight into the result, which must be dense for that.
  const bool direct = is_contiguous(out);
  Scratch res_buf;
  MatrixView res = out;
  if (!direct) {
    res_buf = make_scratch(plan.m() * n);
    res = dense(res_buf.get(), plan.m(), n);
  }
  Scratch parts = make_scratch(T * cnt);     // as in matmul_reduce_scatter_p2p
  Scratch send = make_scratch(plan.m() * n);  // our partials of the peers' rows, at their row offsets
  std::optional<TileCover> tiles;
  if (opts.deterministic) tiles.emplace(plan.m());
  TileCover* tc = tiles ? &*tiles : nullptr;
  std::vector<Work> scatter, gather;
  scatter.reserve(static_cast<size_t>(C));
  gather.reserve(static_cast<size_t>(C));
  try {
    // Reduce-scatter, remote-first: the peers' rows, chunk by chunk.
    post_remote_first(tp, a, w, layout, plan, n, send.get(), parts.get(), tc, kOp, " scatter", opts, st, scatter);
    // Our own rows: each chunk is computed, summed in rank order (+ bias) into the result, and sent to every peer
    // while the next one computes; the peers' reduced chunks arrive into their rows of the result. Every rank posts
    // every chunk's gather, in chunk order, even with no rows of its own in it (the exchanges pair up by order).
    for (int c = 0; c < C; ++c) {
      const RowRange mine = plan.sub(me, c);
      if (mine.count > 0) {
        const int64_t off = (mine.begin - share.begin) * n;
        own_partial(tp, tc, mine, a, w, layout, send.get(), n, parts.get() + me * cnt + off, st);
        {
          Stopwatch sw;
          scatter[static_cast<size_t>(c)].wait();
          st.comm_wait_s += sw.seconds();
        }
        MatrixView y = res.slice_rows(mine.begin, mine.count);
        sum_in_rank_order(parts.get() + off, T, cnt, y);
        if (bias) add_bias(y, bias);  // once, by the rows' owner, before they are sent
      }
      std::vector<P2pSend> sends;
      std::vector<P2pRecv> recvs;
      for (int s = 1; s < T; ++s) {
        const int to = (me + s) % T, from = (me - s + T) % T;
        if (mine.count > 0) sends.push_back({to, res.row(mine.begin), mine.count * n});
        const RowRange sub = plan.sub(from, c);
        if (sub.count > 0) recvs.push_back({from, res.row(sub.begin), sub.count * n});
      }
      gather.push_back(tp.exchange(sends, recvs, chunk_tag(kOp, opts, c, C, plan.chunk_rows(c), n) + " gather"));
      tp.engine()->poll();
    }
    Stopwatch sw;
    wait_all(scatter);
    wait_all(gather);
    st.comm_wait_s += sw.seconds();
  } catch (...) {
    scatter.insert(scatter.end(), std::make_move_iterator(gather.begin()), std::make_move_iterator(gather.end()));
    drain_after_error(scatter, std::current_exception());
    throw;
  }
  if (!direct) copy_rows(res, out);
  st.chunks = C;
}

}  // namespace coc::detail
