// matmul_all_reduce: out = AR_T(a · W) + bias, compute-first (docs/semantics.md §1 and §3). This is the row-parallel
// linear's forward without sequence parallelism: each rank holds a k-slice of the input and of the weight, and the
// partial products are summed over the group (the TP group in the layers). MindSpeed:
// lcal_coc/coc_parallel_linears_all_reduce.py (CoCRowParallelLinearWithAllReduce) and the fused matmul_all_reduce;
// Megatron: RowParallelLinear.forward.
//
// Schedule: m is cut into N contiguous chunks (ChunkPlan(m, 1, N)); for each chunk, GEMM its rows straight into
// `out`, then post the all-reduce of those rows in place, so GEMM i+1 runs while AR i is in flight. The bias is
// added once, after every reduction (edge case 3 of docs/edge-cases.md). Unlike MindSpeed, m need not be a multiple of
// N (edge case 1).
//
// The shared path (customized table, automatic choice, argument agreement, fused dispatch, T = 1) is run_coc_op in
// coc_dispatch.cpp; this file holds the op's checks and schedule.
//
// Point-to-point mode (--coc-comm-algo p2p): p2p_schedules.cpp, a remote-first reduce-scatter
// followed by a gather of each reduced chunk while the next computes.
//
// Deterministic mode: each chunk's partial rows are all-gathered from every rank into a [T, rows, n] scratch and
// summed in rank order in the Work's completion step, and the GEMM runs in fixed row tiles (TileSchedule), so the
// result is bitwise independent of N and of timing.
#include <fmt/format.h>

#include <optional>

#include "coc/core/error.h"
#include "coc_internal.h"
#include "fused_internal.h"

namespace coc {

using namespace detail;

namespace {
constexpr const char* kOp = "matmul_all_reduce";

std::string validate(const CocCall& call, int /*T*/, int /*me*/, const CocOptions& opts) {
  const auto& [a, w, layout, out, bias, gathered, gathered16] = call;
  if (std::string e = check_gemm_operands(a, w, layout, out, opts); !e.empty()) return e;
  const int64_t m = a.rows, k = a.cols, n = weight_n(w, layout);
  if (out.rows != m || out.cols != n)
    return fmt::format("out is [{}, {}] but a [{}, {}] · w (layout {}, [{}, {}]) is [{}, {}]; allocate out as [m, n] "
                       "= [{}, {}] (every rank gets the full reduced result)",
                       out.rows, out.cols, m, k, to_string(layout), w.rows, w.cols, m, n, m, n);
  return check_out_apart(out, a, w);
}

bool fused(Communicator& group, const CocCall& c, const CocOptions& opts, CocStats& st) {
  return fused_matmul_all_reduce(group, c.a, c.w, c.layout, c.out, c.bias, opts, st);
}

CocPending chunked(Communicator& group, const CocCall& call, const Schedule& s, const CocOptions& opts,
                   CocStats& st) {
  const auto& [a, w, layout, out, bias, gathered, gathered16] = call;
  const int T = group.size();
  const int64_t m = s.m, n = s.n;
  if (opts.comm_algo == CocCommAlgo::kP2p && s.effective > 1 && !opts.last_rows_first) {
    const ChunkPlan shares(m, T, s.effective);
    log_schedule(group, s, &shares, opts);
    matmul_all_reduce_p2p(group, a, w, layout, out, bias, shares, opts, st);
    commit_stats(opts, st);
    return CocPending();
  }
  ChunkPlan plan(m, 1, s.effective, opts.last_rows_first);
  log_schedule(group, s, &plan, opts);
  const int C = plan.chunks();
  // The in-place all-reduce needs each chunk's rows back to back; a strided `out` gets a dense stand-in.
  const bool direct = is_contiguous(out);
  Scratch dst_buf;
  MatrixView dst = out;
  if (!direct) {
    dst_buf = make_scratch(m * n);
    dst = dense(dst_buf.get(), m, n);
  }
  std::optional<TileSchedule> tiles;
  if (opts.deterministic) tiles.emplace(plan, /*compute_first=*/true);
  // bf16 wire, non-deterministic: each chunk is rounded into its rows of one staging buffer, all-reduced there by
  // MPI's 16-bit sum and widened back into dst when it completes (deterministic mode stages inside
  // all_gather_then_sum).
  Scratch wire;
  if (wire16(opts) && !opts.deterministic) wire = make_scratch16(m * n);

  std::vector<Work> works;
  works.reserve(static_cast<size_t>(C));
  try {
    for (int c = 0; c < C; ++c) {
      const RowRange rr = plan.contiguous(c);
      if (tiles)
        for (int64_t t : tiles->tiles_for(c)) produce(opts, tiles->rows(t));
      else
        produce(opts, rr);
      Stopwatch sw;
      if (tiles)
        gemm_tiles(*tiles, tiles->tiles_for(c), a, w, layout, dst);
      else
        matmul(a.slice_rows(rr.begin, rr.count), w, layout, dst.slice_rows(rr.begin, rr.count));
      st.gemm_s += sw.seconds();
      const int64_t count = rr.count * n;
      const std::string tag = chunk_tag(kOp, opts, c, C, rr.count, n);
      if (opts.deterministic) {
        works.push_back(all_gather_then_sum(group, dst.row(rr.begin), out.slice_rows(rr.begin, rr.count), dst_buf,
                                            tag, opts.comm_dtype));
      } else if (wire) {
        BFloat16* w16 = as16(wire) + rr.begin * n;
        const MatrixView rows = dst.slice_rows(rr.begin, rr.count);
        to_wire(rows, w16);
        Work wk = group.all_reduce(w16, count, ReduceOp::kSum, tag, /*blocking=*/C == 1 && !opts.nonblocking_serial);
        wk.then([wire, w16, rows]() mutable {
          from_wire(w16, rows);
          wire.reset();
        });
        works.push_back(std::move(wk));
      } else {
        works.push_back(group.all_reduce(dst.row(rr.begin), count, ReduceOp::kSum, tag,
                                         /*blocking=*/C == 1 && !opts.nonblocking_serial));
      }
      progress(group);  // inline engine: move the previous chunks' collectives along between GEMMs
    }
  } catch (...) {
    drain_after_error(works, std::current_exception());
    throw;
  }
  st.chunks = C;
  commit_stats(opts, st);
  const bool copy_back = !direct && !opts.deterministic;  // deterministic mode sums straight into `out`
  auto finish = [dst_buf, dst, call, copy_back]() {
    if (copy_back) copy_rows(dst, call.out);
    if (call.bias) add_bias(call.out, call.bias);  // once, after the reduction
  };
  return CocPending(std::move(works), std::move(finish), opts.stats);
}

constexpr CocOpDesc kDesc{.name = kOp,
                          .id = 1,
                          .gathers = false,
                          .chunks_all_rows = true,  // the point-to-point form chunks each rank's share
                          .has_p2p = true,
                          .pipeline = "compute-first: the GEMM of chunk i+1 overlaps the all-reduce of chunk i",
                          .validate = validate,
                          .fused = fused,
                          .chunked = chunked};
}  // namespace

CocPending matmul_all_reduce_async(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                                   MatrixView out, const float* bias, const CocOptions& opts) {
  return run_coc_op(kDesc, group, {a, w, layout, out, bias}, opts);
}

void matmul_all_reduce(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                       MatrixView out, const float* bias, const CocOptions& opts) {
  matmul_all_reduce_async(group, a, w, layout, out, bias, opts).wait();
}

}  // namespace coc
