// matmul_reduce_scatter: out = rows split_rows(m, T, rank) of RS_T(a · W), + bias; compute-first
// (docs/semantics.md §1 and §3). This is the row-parallel linear's forward with sequence parallelism (and MC2's row
// forward). MindSpeed: lcal_coc/coc_parallel_linears_sequence_parallel.py
// (CoCRowParallelLinearWithReduceScatter) and the fused matmul_reduce_scatter; Megatron:
// RowParallelLinear.forward with sequence_parallel.
//
// Schedule: ChunkPlan(m, T, N). Chunk c is the union over ranks r of sub(r, c), each a contiguous block of rows of
// a (rank r's share, cut into N). For each chunk: one GEMM per sub-block into a scratch laid out rank-major, then
// a reduce-scatter whose recv_counts are the sub-block sizes, received straight into this rank's output rows.
// MindSpeed instead pre-permutes the input ([T,N,p] -> [N,T,p]) and needs m % (T·N) == 0; reading the sub-blocks
// in place needs no permutation and allows any m (edge case 1 of docs/edge-cases.md).
//
// The shared path (customized table, automatic choice, argument agreement, fused dispatch, T = 1) is run_coc_op in
// coc_dispatch.cpp; this file holds the op's checks and schedule.
//
// Deterministic mode: the partial products of all m rows go to an [m, n] scratch in fixed row tiles; each chunk
// is an all-to-all of the sub-blocks (rank r receives every rank's sub(r, c)), summed in rank order in the
// Work's completion step.
#include <fmt/format.h>

#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/runtime/tracer.h"
#include "coc_internal.h"
#include "fused_internal.h"

namespace coc {

using namespace detail;

namespace {
constexpr const char* kOp = "matmul_reduce_scatter";

std::string validate(const CocCall& call, int T, int me, const CocOptions& opts) {
  const auto& [a, w, layout, out, bias, gathered, gathered16] = call;
  if (std::string e = check_gemm_operands(a, w, layout, out, opts); !e.empty()) return e;
  const int64_t m = a.rows, n = weight_n(w, layout);
  const RowRange share = split_rows(m, T, me);
  if (out.rows != share.count)
    return fmt::format("out has {} rows but rank {}'s share of m={} over tp={} is {} rows (split_rows: the first "
                       "m mod tp = {} ranks get one extra row); allocate out as [{}, {}]",
                       out.rows, me, m, T, share.count, m % T, share.count, n);
  if (out.cols != n)
    return fmt::format("out has {} columns but w (layout {}, [{}, {}]) has n={}; allocate out as [{}, {}]",
                       out.cols, to_string(layout), w.rows, w.cols, n, share.count, n);
  return check_out_apart(out, a, w);
}

bool fused(Communicator& group, const CocCall& c, const CocOptions& opts, CocStats& st) {
  return fused_matmul_reduce_scatter(group, c.a, c.w, c.layout, c.out, c.bias, opts, st);
}

/// Deterministic mode: the partial products of all m rows in fixed row tiles into an [m, n] scratch; per chunk an
/// all-to-all of the sub-blocks (rank r receives every rank's sub(r, c)), summed in rank order in the Work's
/// completion step into this rank's rows of call.out. Appends one Work per chunk to `works`.
/// bf16 wire: the chunk's sub-blocks are rounded into a bf16 twin and the all-to-all moves 2-byte elements; the
/// completion step widens what arrived (exactly), sums in rank order in fp32 and rounds once: the bits of the
/// fp32 all-to-all of the rounded partials, in half the bytes.
void post_deterministic(Communicator& group, const CocCall& call, const ChunkPlan& plan, const CocOptions& opts,
                        CocStats& st, std::vector<Work>& works) {
  const auto& [a, w, layout, out, bias, gathered, gathered16] = call;
  const int T = group.size(), me = group.rank(), C = plan.chunks();
  const size_t Tz = static_cast<size_t>(T);
  const int64_t m = plan.m(), n = out.cols;
  const RowRange share = split_rows(m, T, me);
  Scratch partial = make_scratch(m * n);
  const MatrixView pv = dense(partial.get(), m, n);
  Scratch partial16 = wire16(opts) ? make_scratch16(m * n) : Scratch();
  TileSchedule tiles(plan, /*compute_first=*/true);
  for (int c = 0; c < C; ++c) {
    for (int64_t t : tiles.tiles_for(c)) produce(opts, tiles.rows(t));
    Stopwatch sw;
    gemm_tiles(tiles, tiles.tiles_for(c), a, w, layout, pv);
    st.gemm_s += sw.seconds();
    const RowRange mine = plan.sub(me, c);
    const int64_t cnt = mine.count * n;
    std::vector<int64_t> sc(Tz), sd(Tz), rc(Tz, cnt), rd(Tz);
    for (int r = 0; r < T; ++r) {
      const RowRange sub = plan.sub(r, c);
      sc[static_cast<size_t>(r)] = sub.count * n;  // rank r gets my partial of its sub-block...
      sd[static_cast<size_t>(r)] = sub.begin * n;  // ...read in place from the full partial
      rd[static_cast<size_t>(r)] = r * cnt;        // and I get every rank's partial of mine, rank-major
      if (partial16) {
        COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "fp32_to_bf16", {"elements", sub.count * n});
        fp32_to_bf16(pv.row(sub.begin), as16(partial16) + sub.begin * n, sub.count * n);
      }
    }
    const std::string tag = chunk_tag(kOp, opts, c, C, plan.chunk_rows(c), n);
    MatrixView target = out.slice_rows(mine.begin - share.begin, mine.count);
    if (partial16) {
      Scratch parts16 = make_scratch16(T * cnt);
      Work wk = group.all_to_all(as16(partial16), sc, sd, as16(parts16), rc, rd, tag);
      works.push_back(std::move(wk.then([partial16, parts16, T, cnt, target]() mutable {
        sum16_in_rank_order(as16(parts16), T, cnt, target);
        parts16.reset();  // the flight recorder keeps finished ops; do not let it pin the scratches
        partial16.reset();
      })));
    } else {
      Scratch parts = make_scratch(T * cnt);
      Work wk = group.all_to_all(partial.get(), sc, sd, parts.get(), rc, rd, tag);
      works.push_back(std::move(wk.then([partial, parts, T, cnt, target]() mutable {
        sum_in_rank_order(parts.get(), T, cnt, target);
        parts.reset();
        partial.reset();
      })));
    }
    progress(group);
  }
}

CocPending chunked(Communicator& group, const CocCall& call, const Schedule& s, const CocOptions& opts,
                   CocStats& st) {
  const auto& [a, w, layout, out, bias, gathered, gathered16] = call;
  const int T = group.size(), me = group.rank();
  const int64_t m = s.m, n = s.n;
  const RowRange share = split_rows(m, T, me);
  ChunkPlan plan(m, T, s.effective, opts.last_rows_first);
  log_schedule(group, s, &plan, opts);
  const int C = plan.chunks();
  const size_t Tz = static_cast<size_t>(T);
  std::vector<Work> works;
  works.reserve(static_cast<size_t>(C));
  if (opts.comm_algo == CocCommAlgo::kP2p && C > 1 && !opts.last_rows_first) {
    matmul_reduce_scatter_p2p(group, a, w, layout, out, bias, plan, opts, st);
    commit_stats(opts, st);
    return CocPending();
  }
  std::function<void()> finish;
  try {
    if (!opts.deterministic) {
      // One [m, n] scratch for all chunks: chunk c occupies rows [base_c, base_c + chunk_rows(c)), rank-major.
      const bool direct = is_contiguous(out);  // MPI receives into out's rows unless they are strided
      Scratch recv_buf;
      MatrixView recv = out;
      if (!direct) {
        recv_buf = make_scratch(share.count * n);
        recv = dense(recv_buf.get(), share.count, n);
      }
      // bf16 wire: the GEMMs write the partials rounded to bf16 (matmul's bf16 output: the bits of the fp32
      // product rounded, without its fp32 pass), MPI's 16-bit sum reduces them into a bf16 twin of this rank's
      // rows, and each chunk is widened into recv as it completes.
      Scratch send, send16, recv16;
      if (wire16(opts)) {
        send16 = make_scratch16(m * n);
        recv16 = make_scratch16(share.count * n);
      } else {
        send = make_scratch(m * n);
      }
      // The partials of a's rows [rows) into the scratch's rows from `off`.
      auto multiply = [&](RowRange rows, int64_t off) {
        const ConstMatrixView x = a.slice_rows(rows.begin, rows.count);
        Stopwatch sw;  // the GEMM only: MPI progress is not GEMM time (and --profile's gemm events agree)
        if (send16)
          matmul(x, w, layout, Bf16View{as16(send16) + off * n, rows.count, n, n});
        else
          matmul(x, w, layout, dense(send.get() + off * n, rows.count, n));
        st.gemm_s += sw.seconds();
      };
      int64_t base = 0;
      for (int c = 0; c < C; ++c) {
        std::vector<int64_t> counts(Tz);
        int64_t off = base;
        if (C == 1) {
          // Serial: the sub-blocks are the rank shares, back to back in a's order, so one GEMM computes them all.
          // OpenBLAS loses up to 25% on thin m when the rows are split into T calls (bench/inputs at m = 64).
          for (int r = 0; r < T; ++r) counts[static_cast<size_t>(r)] = plan.sub(r, c).count * n;
          produce(opts, {0, m});
          multiply({0, m}, 0);
          off = m;
        } else {
          for (int r = 0; r < T; ++r) {
            const RowRange sub = plan.sub(r, c);
            counts[static_cast<size_t>(r)] = sub.count * n;
            produce(opts, sub);
            multiply(sub, off);
            off += sub.count;
            progress(group);
          }
        }
        const RowRange mine = plan.sub(me, c);
        const std::string tag = chunk_tag(kOp, opts, c, C, off - base, n);
        const bool blocking = C == 1 && !opts.nonblocking_serial;
        if (send16) {
          BFloat16* r16 = as16(recv16) + (mine.begin - share.begin) * n;
          const MatrixView rows = recv.slice_rows(mine.begin - share.begin, mine.count);
          Work wk = group.reduce_scatter(as16(send16) + base * n, r16, counts, tag, blocking);
          wk.then([send16, recv16, r16, rows]() mutable {
            from_wire(r16, rows);
            send16.reset();
            recv16.reset();
          });
          works.push_back(std::move(wk));
        } else {
          Work wk = group.reduce_scatter(send.get() + base * n, recv.row(mine.begin - share.begin), counts, tag,
                                         blocking);
          wk.then([send]() mutable { send.reset(); });  // MPI reads the scratch until the op completes
          works.push_back(std::move(wk));
        }
        base = off;
      }
      finish = [recv_buf, recv, call, direct]() {
        if (!direct) copy_rows(recv, call.out);
        if (call.bias) add_bias(call.out, call.bias);  // once, after the reduction
      };
    } else {
      post_deterministic(group, call, plan, opts, st, works);
      finish = [call]() {
        if (call.bias) add_bias(call.out, call.bias);
      };
    }
  } catch (...) {
    drain_after_error(works, std::current_exception());
    throw;
  }
  st.chunks = C;
  commit_stats(opts, st);
  return CocPending(std::move(works), std::move(finish), opts.stats);
}

constexpr CocOpDesc kDesc{.name = kOp,
                          .id = 2,
                          .gathers = false,
                          .chunks_all_rows = false,
                          .has_p2p = true,
                          .pipeline = "compute-first: the GEMMs of chunk i+1 overlap the reduce-scatter of chunk i",
                          .validate = validate,
                          .fused = fused,
                          .chunked = chunked};
}  // namespace

CocPending matmul_reduce_scatter_async(Communicator& group, ConstMatrixView a, ConstMatrixView w,
                                       WeightLayout layout, MatrixView out, const float* bias,
                                       const CocOptions& opts) {
  return run_coc_op(kDesc, group, {a, w, layout, out, bias}, opts);
}

void matmul_reduce_scatter(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                           MatrixView out, const float* bias, const CocOptions& opts) {
  matmul_reduce_scatter_async(group, a, w, layout, out, bias, opts).wait();
}

}  // namespace coc
