// The point-to-point CoC schedules (CocCommAlgo::kP2p) of matmul_reduce_scatter, all_gather_matmul[_v2] and
// matmul_all_reduce: the same results as the collective schedules, in an order that hides more of the link.
//
// Why: with the collective schedules every chunk mixes all ranks' rows, so the first collective waits for a GEMM
// chunk and the last GEMM chunk waits for a collective, and both ends of the pipeline are exposed. With
// point-to-point messages a rank can order its work by who needs it:
//  - reduce-scatter, remote-first: compute the rows that peers own first and send each chunk as soon as it is
//    computed; compute this rank's own rows last, while the sends drain, reducing each chunk once its peers'
//    partials are in.
//  - all-gather, local-first: this rank's own rows need no communication, so they are multiplied first, while the
//    peers' rows arrive; each peer chunk is multiplied as soon as it is in.
// With T ranks, a fraction 1/T of the GEMM thus overlaps communication with no pipeline fill at all (half of it at
// tp = 2). This is the order of PyTorch's async tensor parallelism (torch/distributed/_symmetric_memory,
// fused_all_gather_matmul: "local shard first") and of Flux (Chang et al., 2024, §4); MindSpeed's CoC has no
// equivalent because it drives HCCL collectives. Built from MPI_Isend/MPI_Irecv (Communicator::exchange), which
// also sidesteps Open MPI's slow non-blocking reduce-scatter (docs/performance.md, "Prototypes").
//
//  - all-reduce: the reduce-scatter above, then each reduced chunk of this rank's rows is sent to every peer as soon
//    as it is summed, while the next own chunk computes (reduce-scatter + all-gather, as ring all-reduces split it,
//    but with each rank's rows kept whole). MPI libraries' TCP all-reduces run 1.5-3x off the wire
//    (docs/performance.md, "Prototypes"); these messages move at link speed, and the gather of chunk i overlaps the
//    GEMM of chunk i+1.
//
// Every schedule posts all its receives before its first GEMM (a message that finds its receive posted lands in
// place, with no unexpected-message copy inside MPI) and chains each chunk's sends behind the previous chunk's
// local send completion, advanced by the progress engine (Communicator::exchange's `after`). Posted all at once,
// MPI interleaves the pending sends and every chunk arrives near the end together with the last (measured at
// 1 Gbit/s: the all-gather's first chunk ~20 ms after the GEMM wanted it; the reduce-scatter's chunks in clumps); a
// window advanced by the main thread at GEMM boundaries left the link idle between boundaries. Chained on local
// completion, the next send starts while the socket still drains the previous one: chunks arrive in order and the
// link stays busy (docs/performance.md, point 6) — provided the library sends them eagerly: a rendezvous per chunk
// costs a handshake through both ranks' progress (scripts/cluster raises Open MPI's TCP eager limit for that).
//
// The reduce-scatter and the all-reduce receive the previous ring rank's partial of this rank's rows straight
// into the result and then run this rank's GEMM onto it (beta = 1), so at tp = 2 the reduction costs no memory pass
// (reduce_own_rows); with the threaded engine, consecutive chunks whose data is in go through one GEMM call
// (merge_ready_chunks), since each call packs the weight again.
//
// Deterministic mode: the GEMMs run in the fixed tiles of every deterministic schedule (TileCover, ready_tiles:
// each tile once, when its rows are first needed or have all arrived) and the partials are summed in rank order, so
// the bits are those of the collective schedules for every N.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <span>

#include "coc/core/bf16.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/runtime/tracer.h"
#include "coc_internal.h"

namespace coc::detail {

namespace {
/// y = x · W, timed into st.gemm_s, then one MPI poll (the inline engine moves messages only when called). Measured
/// on the 1 Gbit/s cluster: polling more often (every ~2 ms of GEMM) raised the GEMM slowdown σ from ~0.2 to ~0.3
/// and gained nothing, so one poll per chunk it is.
void matmul_then_poll(Communicator& group, ConstMatrixView x, ConstMatrixView w, WeightLayout layout, MatrixView y,
                    CocStats& st) {
  Stopwatch sw;
  matmul(x, w, layout, y);
  st.gemm_s += sw.seconds();
  progress(group);
}

/// Deterministic mode: the not yet computed tiles covering `rows` of a · W into the full partial `full` ([m, n]),
/// timed into st.gemm_s, then one MPI poll.
void cover_then_poll(Communicator& group, TileCover& tiles, RowRange rows, ConstMatrixView a, ConstMatrixView w,
                     WeightLayout layout, MatrixView full, CocStats& st) {
  Stopwatch sw;
  tiles.cover(rows, a, w, layout, full);
  st.gemm_s += sw.seconds();
  progress(group);
}

/// This rank's partial of its own rows `mine` into `dst` (its slot of parts): one GEMM, or in deterministic mode
/// (`tiles` set) the covering tiles into the full partial `send` ([m, n]) and a copy of the rows.
void own_partial(Communicator& group, TileCover* tiles, RowRange mine, ConstMatrixView a, ConstMatrixView w,
                 WeightLayout layout, float* send, int64_t n, float* dst, CocStats& st) {
  if (!tiles) {
    matmul_then_poll(group, a.slice_rows(mine.begin, mine.count), w, layout, dense(dst, mine.count, n), st);
    return;
  }
  cover_then_poll(group, *tiles, mine, a, w, layout, dense(send, a.rows, n), st);
  copy_rows(dense(send + mine.begin * n, mine.count, n), dense(dst, mine.count, n));
}

/// Where the peers' partials of this rank's rows land, and how they are summed (the reduce half shared by the
/// reduce-scatter and the all-reduce). parts: [T, share rows, n], this rank's share, one slot per rank.
///  - Accumulating (`acc` set: non-deterministic mode, result rows dense): the partial of the previous rank in the
///    ring (from = me - 1) arrives straight into `acc` (this rank's rows of the result, [share rows, n]); the other
///    peers' into parts[from]. Once a chunk's partials are in, the others are added onto acc and this rank's GEMM
///    accumulates onto it (beta = 1), so at tp = 2 the reduction costs no pass over memory at all: OpenBLAS's
///    kernels always add their product into C (for beta = 0 its driver first zeroes C), and MPI wrote the partial
///    there.
///  - Otherwise (deterministic mode, or a strided result) every peer's partial lands in parts[from], this rank's
///    GEMM writes parts[me], and the chunk is summed in rank order.
struct ReduceTarget {
  float* parts = nullptr;
  float* acc = nullptr;  ///< dense [share rows, n], or null
  int64_t n = 0, cnt = 0;  ///< row width; elements of one slot of parts (share rows · n)
  /// bf16 wire (CocOptions::comm_dtype; never with acc): this rank's partial is rounded like the peers' (which
  /// post_remote_first rounds when it converts them for the wire) and the rank-ordered sum is rounded once.
  bool round16 = false;
  /// bf16 wire: the peers' partials arrive as 2-byte elements in parts16 (slots laid out as in parts) and are
  /// widened into parts (exactly) before the sum, so the bits are those of the fp32 sum of the rounded partials.
  BFloat16* parts16 = nullptr;
  float* slot(int r, int64_t off) const { return parts + r * cnt + off; }
  BFloat16* slot16(int r, int64_t off) const { return parts16 + r * cnt + off; }
};

/// Posts, for every chunk, the receives of the peers' partials of this rank's rows of that chunk (one
/// exchange_recvs per chunk, all before any GEMM: a message that finds its receive posted lands in place), appended
/// to `recvs` as they are posted, so that the caller can drain them if a later one throws.
void post_partial_recvs(Communicator& group, const ChunkPlan& plan, const ReduceTarget& t, const char* op,
                        const char* what, const CocOptions& opts, std::vector<Work>& recvs) {
  const int T = group.size(), me = group.rank(), C = plan.chunks();
  const RowRange share = plan.share(me);
  for (int c = 0; c < C; ++c) {
    std::vector<P2pRecv> list;
    const RowRange mine = plan.sub(me, c);
    if (mine.count > 0) {
      const int64_t off = (mine.begin - share.begin) * t.n;
      for (int s = 1; s < T; ++s) {
        const int from = (me - s + T) % T;
        if (t.parts16)
          list.push_back({from, t.slot16(from, off), mine.count * t.n, DType::kBF16});
        else
          list.push_back({from, t.acc && s == 1 ? t.acc + off : t.slot(from, off), mine.count * t.n});
      }
    }
    recvs.push_back(group.exchange_recvs(list, chunk_tag(op, opts, c, C, plan.chunk_rows(c), t.n) + what + " recv"));
  }
}

/// The remote-first half shared by the reduce-scatter and the all-reduce: for each chunk c, the GEMM of the peers'
/// rows of c into `send` ([m, n], at their row offsets), then the sends of those rows, matched with the peers'
/// receives of chunk c (`recvs[c]`, from post_partial_recvs). With `tiles` (deterministic mode) the GEMMs run in
/// its fixed tiles. Appends one Work per chunk to `works`, which the caller waits for (and drains on error).
/// `send16` (bf16 wire, else null): [m, n] bf16 twin of `send`; each sent block is rounded into it and leaves as
/// 2-byte elements (the values a rounded fp32 block would carry, in half the bytes).
void post_remote_first(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                       const ChunkPlan& plan, int64_t n, float* send, BFloat16* send16, TileCover* tiles,
                       const std::vector<Work>& recvs,
                       const char* op, const char* what, const CocOptions& opts, CocStats& st,
                       std::vector<Work>& works) {
  const int T = group.size(), me = group.rank();
  for (int c = 0; c < plan.chunks(); ++c) {
    std::vector<P2pSend> sends;
    for (int s = 1; s < T; ++s) {
      const int to = (me + s) % T;  // a ring order, so that no rank is everyone's target
      const RowRange sub = plan.sub(to, c);
      if (sub.count > 0) {
        produce(opts, sub, tiles ? plan.m() : 0);
        if (tiles)
          cover_then_poll(group, *tiles, sub, a, w, layout, dense(send, plan.m(), n), st);
        else
          matmul_then_poll(group, a.slice_rows(sub.begin, sub.count), w, layout,
                           dense(send + sub.begin * n, sub.count, n), st);
        if (send16) {
          COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "fp32_to_bf16", {"elements", sub.count * n});
          fp32_to_bf16(send + sub.begin * n, send16 + sub.begin * n, sub.count * n);
          sends.push_back({to, send16 + sub.begin * n, sub.count * n, DType::kBF16});
        } else {
          sends.push_back({to, send + sub.begin * n, sub.count * n});
        }
      }
      progress(group);
    }
    // Chained behind the previous chunk's sends, as in the all-gather (Communicator::exchange's `after`): posted
    // at once, MPI interleaves the pending sends' fragments and the peers' partials arrive in clumps near the end
    // (measured at N = 8: chunks 1-3 all at ~56 ms, the last at ~99 ms, where in order they take ~8 ms each),
    // so the own rows' GEMMs wait or fall back to a scratch and an extra add.
    const Work none;
    works.push_back(group.exchange_sends(sends, recvs[static_cast<size_t>(c)],
                                         chunk_tag(op, opts, c, plan.chunks(), plan.chunk_rows(c), n) + what,
                                         works.empty() ? none : works.back()));
  }
}

/// This rank's rows `mine` (one chunk, or several consecutive ones), reduced into `dst` (those rows of the
/// result): this rank's partial plus the peers' ones, which arrive with `recvs` (one Work per chunk; ReduceTarget
/// says where they land). Accumulating, the GEMM adds straight onto the received partials when they are all in;
/// when they are not, the GEMM goes to parts[me] and is added once they are, rather than waiting with the core idle.
void reduce_own_rows(Communicator& group, TileCover* tiles, RowRange mine, RowRange share, ConstMatrixView a,
                     ConstMatrixView w, WeightLayout layout, float* send, const ReduceTarget& t,
                     std::span<Work> recvs, MatrixView dst, CocStats& st) {
  const int T = group.size(), me = group.rank();
  const int64_t off = (mine.begin - share.begin) * t.n;
  auto wait_recvs = [&] {
    Stopwatch sw;
    for (Work& r : recvs) r.wait();
    st.comm_wait_s += sw.seconds();
  };
  if (!t.acc) {
    own_partial(group, tiles, mine, a, w, layout, send, t.n, t.slot(me, off), st);
    if (t.round16) round_to_bf16(t.slot(me, off), mine.count * t.n);
    wait_recvs();
    COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "sum_partials", {"rows", dst.rows}, {"cols", dst.cols}, {"parts", T});
    if (t.parts16)
      for (int r = 0; r < T; ++r)
        if (r != me) bf16_to_fp32(t.slot16(r, off), t.slot(r, off), mine.count * t.n);
    sum_in_rank_order(t.slot(0, off), T, t.cnt, dst);
    if (t.round16)
      for (int64_t i = 0; i < dst.rows; ++i) round_to_bf16(dst.row(i), dst.cols);
    return;
  }
  auto add_others = [&] {  // the peers beyond the first, whose partials sit in parts
    for (int s = 2; s < T; ++s) add_inplace(dst, dense(t.slot((me - s + T) % T, off), dst.rows, dst.cols));
  };
  if (std::all_of(recvs.begin(), recvs.end(), [](Work& r) { return r.test(); })) {
    add_others();
    Stopwatch sw;
    matmul(a.slice_rows(mine.begin, mine.count), w, layout, dst, /*accumulate=*/true);
    st.gemm_s += sw.seconds();
    progress(group);
    return;
  }
  own_partial(group, nullptr, mine, a, w, layout, send, t.n, t.slot(me, off), st);
  wait_recvs();
  add_others();
  add_inplace(dst, dense(t.slot(me, off), dst.rows, dst.cols));
}

/// Whether a schedule may merge consecutive chunks whose data is ready into one GEMM call. Each call packs the
/// whole weight again (~0.5 ms for a 1024 x 1024 one; δ of 5-15% at N = 8-16 on the 1 Gbit/s cluster), and only
/// the chunking of what is sent needs to be fine. With the inline engine the GEMM boundaries are the only moments
/// MPI progresses, so there every chunk stays a call.
bool merge_ready_chunks(Communicator& group, const CocOptions& opts) {
  return !opts.deterministic && progresses_in_background(group);
}

/// bf16 wire, all-reduce: the peers' reduced rows arrived as bf16 in `g16` ([m, n], rank-major shares) and are
/// widened into their rows of `res` (exact), plus the bias, which each owner adds to its own rows after converting
/// them for the wire: the same fp32 additions, so the bits of the fp32 wire's rows.
void widen_peer_rows(const ChunkPlan& plan, int me, int T, const BFloat16* g16, MatrixView res, const float* bias) {
  for (int r = 0; r < T; ++r) {
    const RowRange sh = plan.share(r);
    if (r == me || sh.count == 0) continue;
    MatrixView y = res.slice_rows(sh.begin, sh.count);
    from_wire(g16 + sh.begin * res.cols, y);
    if (bias) add_bias(y, bias);
  }
}

/// bf16 wire: pooled bf16 scratch for the received partials (`parts` elements) and the sent ones (`send`
/// elements); both empty on an fp32 wire.
std::pair<Scratch, Scratch> wire16_twins(const CocOptions& opts, int64_t parts, int64_t send) {
  if (!wire16(opts)) return {};
  return {make_scratch16(parts), make_scratch16(send)};
}
}  // namespace

void matmul_reduce_scatter_p2p(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                               MatrixView out, const float* bias, const ChunkPlan& plan, const CocOptions& opts,
                               CocStats& st) {
  constexpr const char* kOp = "matmul_reduce_scatter";
  const int T = group.size(), me = group.rank(), C = plan.chunks();
  const int64_t n = out.cols;
  const RowRange share = plan.share(me);
  // A bf16 wire rounds this rank's partial and the sum, so it takes the rank-ordered sum, never beta = 1.
  const bool accumulate = !opts.deterministic && !wire16(opts) && is_contiguous(out);
  // parts[r] = rank r's partial of this rank's rows (accumulating: only the peers beyond the first, and ours when
  // its GEMM runs before the peers' partials are in).
  Scratch parts = make_scratch(T * share.count * n);
  // bf16 wire: the 2-byte twins of parts and send (wire16_twins).
  const auto [parts16, send16] = wire16_twins(opts, T * share.count * n, plan.m() * n);
  const ReduceTarget target{parts.get(), accumulate ? out.data : nullptr, n, share.count * n, wire16(opts),
                            as16(parts16)};
  // Our partials of the peers' rows, at their row offsets in the full matrix (our own rows' slots stay unused,
  // except in deterministic mode, where whole tiles land here).
  Scratch send = make_scratch(plan.m() * n);
  std::optional<TileCover> tiles;
  if (opts.deterministic) tiles.emplace(plan.m());
  TileCover* tc = tiles ? &*tiles : nullptr;
  std::vector<Work> recvs, works;
  recvs.reserve(static_cast<size_t>(C));
  works.reserve(static_cast<size_t>(C));
  try {
    post_partial_recvs(group, plan, target, kOp, "", opts, recvs);
    // MPI writes parts and reads send until the Works complete, also after a timeout unwinds this frame.
    for (Work& r : recvs) r.keep_alive(parts).keep_alive(parts16);
    post_remote_first(group, a, w, layout, plan, n, send.get(), as16(send16), tc, recvs, kOp, "", opts, st, works);
    for (Work& x : works) x.keep_alive(send).keep_alive(send16);
    // Our own rows last, while the sends drain; each chunk is reduced once its peers' partials are in, and
    // consecutive chunks whose partials are all in go through one GEMM (merge_ready_chunks).
    const bool merge = accumulate && merge_ready_chunks(group, opts);
    for (int c = 0; c < C;) {
      RowRange mine = plan.sub(me, c);
      if (mine.count == 0) {
        ++c;
        continue;
      }
      int last = c;
      if (merge && recvs[static_cast<size_t>(c)].test())
        while (last + 1 < C && plan.sub(me, last + 1).count > 0 && recvs[static_cast<size_t>(last) + 1].test()) ++last;
      mine.count = plan.sub(me, last).end() - mine.begin;
      produce(opts, mine, tc ? plan.m() : 0);
      reduce_own_rows(group, tc, mine, share, a, w, layout, send.get(), target,
                      std::span<Work>(recvs).subspan(static_cast<size_t>(c), static_cast<size_t>(last - c + 1)),
                      out.slice_rows(mine.begin - share.begin, mine.count), st);
      c = last + 1;
    }
    wait_all(recvs);
    wait_all(works);  // chunks whose own rows are empty on this rank still carry our sends
  } catch (...) {
    recvs.insert(recvs.end(), std::make_move_iterator(works.begin()), std::make_move_iterator(works.end()));
    drain_after_error(recvs, std::current_exception());
    throw;
  }
  if (bias) add_bias(out, bias);
  st.chunks = C;
}

void all_gather_matmul_p2p(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                           MatrixView out, const float* bias, MatrixView g, const float* send,
                           const ChunkPlan& plan, const CocOptions& opts, CocStats& st) {
  constexpr const char* kOp = "all_gather_matmul";
  const int T = group.size(), me = group.rank(), C = plan.chunks();
  const int64_t k = g.cols;
  const RowRange share = plan.share(me);
  std::vector<Work> works;
  works.reserve(static_cast<size_t>(C));
  // bf16 wire: `send` holds bf16 values (the caller rounded it); they leave as 2-byte elements from send16 and
  // arrive in g16 ([m, k]), widened (exactly) into g chunk by chunk before the GEMMs read them.
  Scratch send16, g16;
  if (wire16(opts)) {
    send16 = make_scratch16(share.count * k);
    g16 = make_scratch16(plan.m() * k);
    COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "fp32_to_bf16", {"elements", share.count * k});
    fp32_to_bf16(send, as16(send16), share.count * k);
  }
  auto post = [&](int c) {
    std::vector<P2pSend> sends;
    std::vector<P2pRecv> recvs;
    const RowRange mine = plan.sub(me, c);
    const int64_t at = (mine.begin - share.begin) * k;
    for (int s = 1; s < T; ++s) {
      const int to = (me + s) % T, from = (me - s + T) % T;
      if (mine.count > 0)
        sends.push_back(send16 ? P2pSend{to, as16(send16) + at, mine.count * k, DType::kBF16}
                               : P2pSend{to, send + at, mine.count * k});
      const RowRange sub = plan.sub(from, c);
      if (sub.count > 0)
        recvs.push_back(g16 ? P2pRecv{from, as16(g16) + sub.begin * k, sub.count * k, DType::kBF16}
                            : P2pRecv{from, g.row(sub.begin), sub.count * k});
    }
    // Chunk c's sends follow chunk c-1's (Communicator::exchange's `after`) so that the chunks arrive in order
    // rather than all together at the end; the receives are all posted now. `works` never reallocates (reserved).
    const Work none;
    works.push_back(group.exchange(sends, recvs, chunk_tag(kOp, opts, c, C, plan.chunk_rows(c), k),
                                   c > 0 ? works[static_cast<size_t>(c - 1)] : none));
    works.back().keep_alive(send16).keep_alive(g16);
  };
  auto widen = [&](int first, int last) {  // the peers' rows of chunks [first, last], bf16 wire only
    if (!g16) return;
    for (int s = 1; s < T; ++s) {
      const int from = (me - s + T) % T;
      const RowRange f = plan.sub(from, first);
      const RowRange rows{f.begin, plan.sub(from, last).end() - f.begin};
      if (rows.count > 0) from_wire(as16(g16) + rows.begin * k, g.slice_rows(rows.begin, rows.count));
    }
  };
  auto gemm_rows = [&](ConstMatrixView x, RowRange rows) {
    MatrixView y = out.slice_rows(rows.begin, rows.count);
    matmul_then_poll(group, x, w, layout, y, st);
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
    // Our own rows first: they need nothing from the peers (one GEMM when chunks may merge).
    const bool merge = merge_ready_chunks(group, opts);
    if (opts.deterministic) {
      gemm_ready(ready[0]);
    } else if (merge) {
      if (share.count > 0) gemm_rows(a, share);
    } else {
      for (int c = 0; c < C; ++c) {
        const RowRange mine = plan.sub(me, c);
        if (mine.count > 0) gemm_rows(a.slice_rows(mine.begin - share.begin, mine.count), mine);
      }
    }
    // Then the peers' rows, chunk by chunk as they arrive; chunks already in are merged into one GEMM per peer (a
    // peer's rows of consecutive chunks are consecutive).
    for (int c = 0; c < C;) {
      {
        Stopwatch sw;
        works[static_cast<size_t>(c)].wait();
        st.comm_wait_s += sw.seconds();
      }
      if (opts.deterministic) {
        widen(c, c);
        gemm_ready(ready[static_cast<size_t>(c) + 1]);
        ++c;
        continue;
      }
      int last = c;
      if (merge)
        while (last + 1 < C && works[static_cast<size_t>(last) + 1].test()) ++last;
      widen(c, last);
      for (int s = 1; s < T; ++s) {
        const int from = (me - s + T) % T;
        const RowRange first = plan.sub(from, c);
        const RowRange rows{first.begin, plan.sub(from, last).end() - first.begin};
        if (rows.count > 0) gemm_rows(g.slice_rows(rows.begin, rows.count), rows);
      }
      c = last + 1;
    }
  } catch (...) {
    drain_after_error(works, std::current_exception());
    throw;
  }
  st.chunks = C;
}

void matmul_all_reduce_p2p(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                           MatrixView out, const float* bias, const ChunkPlan& plan, const CocOptions& opts,
                           CocStats& st) {
  constexpr const char* kOp = "matmul_all_reduce";
  const int T = group.size(), me = group.rank(), C = plan.chunks();
  const int64_t n = out.cols;
  const RowRange share = plan.share(me);
  // MPI receives the peers' rows straight into the result, which must be dense for that.
  const bool direct = is_contiguous(out);
  Scratch res_buf;
  MatrixView res = out;
  if (!direct) {
    res_buf = make_scratch(plan.m() * n);
    res = dense(res_buf.get(), plan.m(), n);
  }
  Scratch parts = make_scratch(T * share.count * n);  // as in matmul_reduce_scatter_p2p
  const auto [parts16, send16] = wire16_twins(opts, T * share.count * n, plan.m() * n);
  const ReduceTarget target{parts.get(), opts.deterministic || wire16(opts) ? nullptr : res.row(share.begin), n,
                            share.count * n, wire16(opts), as16(parts16)};
  Scratch send = make_scratch(plan.m() * n);  // our partials of the peers' rows, at their row offsets
  // bf16 wire: the gathered rows travel as bf16 through res16 ([m, n]; widened into res at the end).
  Scratch res16 = wire16(opts) ? make_scratch16(plan.m() * n) : Scratch();
  std::optional<TileCover> tiles;
  if (opts.deterministic) tiles.emplace(plan.m());
  TileCover* tc = tiles ? &*tiles : nullptr;
  std::vector<Work> scatter_recvs, gather_recvs, scatter, gather;
  for (auto* v : {&scatter_recvs, &gather_recvs, &scatter, &gather}) v->reserve(static_cast<size_t>(C));
  try {
    // Every receive is posted before any GEMM: the peers' partials of our rows (scatter), then their reduced rows
    // (gather), which land in their rows of the result.
    post_partial_recvs(group, plan, target, kOp, " scatter", opts, scatter_recvs);
    for (int c = 0; c < C; ++c) {
      std::vector<P2pRecv> recvs;
      for (int s = 1; s < T; ++s) {
        const int from = (me - s + T) % T;
        const RowRange sub = plan.sub(from, c);
        if (sub.count == 0) continue;
        if (res16)
          recvs.push_back({from, as16(res16) + sub.begin * n, sub.count * n, DType::kBF16});
        else
          recvs.push_back({from, res.row(sub.begin), sub.count * n});
      }
      gather_recvs.push_back(
          group.exchange_recvs(recvs, chunk_tag(kOp, opts, c, C, plan.chunk_rows(c), n) + " gather recv"));
    }
    // Reduce-scatter, remote-first: the peers' rows, chunk by chunk.
    // MPI writes parts and res_buf and reads send and res_buf until the Works complete, also after a timeout
    // unwinds this frame.
    for (auto* v : {&scatter_recvs, &gather_recvs})
      for (Work& r : *v) r.keep_alive(parts).keep_alive(res_buf).keep_alive(res16);
    for (Work& r : scatter_recvs) r.keep_alive(parts16);
    post_remote_first(group, a, w, layout, plan, n, send.get(), as16(send16), tc, scatter_recvs, kOp, " scatter",
                      opts, st, scatter);
    for (Work& x : scatter) x.keep_alive(send).keep_alive(send16);
    // Our own rows: each chunk is reduced (+ bias) into the result and sent to every peer while the next one
    // computes. Every rank posts every chunk's gather sends, in chunk order, even with no rows of its own in it
    // (each half takes a sequence number).
    for (int c = 0; c < C; ++c) {
      const RowRange mine = plan.sub(me, c);
      std::vector<P2pSend> sends;
      if (mine.count > 0) {
        MatrixView y = res.slice_rows(mine.begin, mine.count);
        produce(opts, mine, tc ? plan.m() : 0);
        reduce_own_rows(group, tc, mine, share, a, w, layout, send.get(), target,
                        std::span<Work>(scatter_recvs).subspan(static_cast<size_t>(c), 1), y, st);
        if (res16) {
          // bf16 wire: the reduced rows (bf16 values) leave as 2-byte elements; every rank adds the bias itself.
          BFloat16* y16 = as16(res16) + mine.begin * n;
          to_wire(y, y16);
          for (int s = 1; s < T; ++s) sends.push_back({(me + s) % T, y16, mine.count * n, DType::kBF16});
        }
        if (bias) add_bias(y, bias);  // once, by the rows' owner (on an fp32 wire before they are sent)
        if (!res16)
          for (int s = 1; s < T; ++s) sends.push_back({(me + s) % T, res.row(mine.begin), mine.count * n});
      }
      // One ordered stream: each gather send follows the previous one, the first follows the scatter's last.
      gather.push_back(group.exchange_sends(sends, gather_recvs[static_cast<size_t>(c)],
                                            chunk_tag(kOp, opts, c, C, plan.chunk_rows(c), n) + " gather",
                                            gather.empty() ? scatter.back() : gather.back()));
      gather.back().keep_alive(res_buf).keep_alive(res16);
      progress(group);
    }
    Stopwatch sw;
    wait_all(scatter_recvs);
    wait_all(scatter);
    wait_all(gather_recvs);
    wait_all(gather);
    st.comm_wait_s += sw.seconds();
    if (res16) widen_peer_rows(plan, me, T, as16(res16), res, bias);
  } catch (...) {
    std::vector<Work> all;
    for (auto* v : {&scatter_recvs, &scatter, &gather_recvs, &gather})
      all.insert(all.end(), std::make_move_iterator(v->begin()), std::make_move_iterator(v->end()));
    drain_after_error(all, std::current_exception());
    throw;
  }
  if (!direct) copy_rows(res, out);
  st.chunks = C;
}

}  // namespace coc::detail
