// all_gather_matmul[_v2]: out = AG_T(a) · W + bias, communicate-first (docs/semantics.md §1 and §3). This is the
// column-parallel linear's forward with sequence parallelism (MC2's column forward), and with `gathered` (v2) the
// row-parallel backward, whose gathered dY feeds dW. MindSpeed: lcal_coc/coc_parallel_linears_sequence_parallel.py
// (CoCColumnSeqParallelFunction) and the fused all_gather_matmul[_v2]; Megatron: ColumnParallelLinear.forward
// with sequence_parallel.
//
// Schedule: a depth-1 software pipeline over ChunkPlan(m, T, N). The all-gather of chunk c collects every rank's
// sub(r, c) rows with displacements sub(r, c).begin·k, so rows land in the gathered [m, k] buffer already in
// rank-major order (no un-shuffle copy, unlike MindSpeed's chunk-major output). The AG of chunk c+1 is posted
// before chunk c is computed; after AG c is waited, the T sub-blocks of chunk c are multiplied into the same rows
// of `out`. Any m works (MindSpeed's AG failed on sizes when m % N != 0; edge case 1 of docs/edge-cases.md).
//
// The shared path (customized table, automatic choice, argument agreement, fused dispatch, T = 1) is run_coc_op in
// coc_dispatch.cpp; this file holds the op's checks and schedule.
//
// Deterministic mode: no reduction is involved, but rows are still computed in fixed tiles (TileSchedule), each
// once all of its input rows have arrived, so the output is bitwise identical for every N.
#include <fmt/format.h>

#include <optional>

#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/runtime/tracer.h"
#include "coc_internal.h"
#include "fused_internal.h"

namespace coc {

using namespace detail;

namespace {
std::string validate(const CocCall& call, int T, int me, const CocOptions& opts) {
  const auto& [a, w, layout, out, bias, gathered, gathered16] = call;
  std::string e = check_gemm_operands(a, w, layout, out, opts);
  if (e.empty() && gathered) e = check_view(*gathered, "gathered");
  if (!e.empty()) return e;
  const int64_t m = out.rows, k = a.cols, n = weight_n(w, layout);
  const RowRange share = split_rows(m, T, me);
  if (a.rows != share.count)
    return fmt::format("a has {} rows but rank {}'s share of m={} (out's rows) over tp={} is {} rows (split_rows: "
                       "the first m mod tp = {} ranks get one extra row); out must hold all m gathered rows and a "
                       "this rank's share",
                       a.rows, me, m, T, share.count, m % T);
  if (out.cols != n)
    return fmt::format("out has {} columns but w (layout {}, [{}, {}]) has n={}; allocate out as [{}, {}]",
                       out.cols, to_string(layout), w.rows, w.cols, n, m, n);
  if (gathered && (gathered->rows != m || gathered->cols != k))
    return fmt::format("gathered is [{}, {}] but must be [m, k] = [{}, {}] (all ranks' a stacked rank-major)",
                       gathered->rows, gathered->cols, m, k);
  if (gathered16 && (gathered16->rows != m || gathered16->cols != k || gathered16->ld < k))
    return fmt::format("the bf16 gathered is [{}, {}] (ld {}) but must be [m, k] = [{}, {}]", gathered16->rows,
                       gathered16->cols, gathered16->ld, m, k);
  if (overlaps(out, a) || overlaps(out, w) || (gathered && overlaps(out, *gathered)))
    return "out overlaps a, w or gathered: the GEMM would overwrite its own inputs; write into a separate buffer";
  if (gathered && overlaps(*gathered, w))
    return "gathered overlaps w: the all-gather would overwrite the weight; use a separate buffer";
  return {};
}

/// Rows of fp32 `g` rounded into bf16 `dst` (same shape): the bf16 gathered input of the paths that gather fp32.
void round_into(ConstMatrixView g, Bf16View dst) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "fp32_to_bf16", {"elements", g.rows * g.cols});
  fp32_to_bf16_rows(g.data, g.ld, dst.data, dst.ld, g.rows, g.cols);
}

bool fused(Communicator& group, const CocCall& c, const CocOptions& opts, CocStats& st) {
  if (!c.gathered16) return fused_all_gather_matmul(group, c.a, c.w, c.layout, c.out, c.bias, c.gathered, opts, st);
  // The node-shared kernel gathers fp32: it fills a scratch, rounded into the bf16 buffer after.
  Scratch buf = make_scratch(c.gathered16->rows * c.a.cols);
  MatrixView g = dense(buf.get(), c.gathered16->rows, c.a.cols);
  if (!fused_all_gather_matmul(group, c.a, c.w, c.layout, c.out, c.bias, &g, opts, st)) return false;
  round_into(g, *c.gathered16);
  return true;
}

CocPending chunked(Communicator& group, const CocCall& call, const Schedule& s, const CocOptions& opts,
                   CocStats& st) {
  const ConstMatrixView a = call.a, w = call.w;
  const WeightLayout layout = call.layout;
  const MatrixView out = call.out;
  const float* bias = call.bias;
  MatrixView* gathered = call.gathered;
  Bf16View* gathered16 = call.gathered16;
  const char* op = s.op;
  const int T = group.size(), me = group.rank();
  const int64_t m = s.m, k = s.k;
  const RowRange share = split_rows(m, T, me);
  ChunkPlan plan(m, T, s.effective);
  log_schedule(group, s, &plan, opts);
  const int C = plan.chunks();
  const size_t Tz = static_cast<size_t>(T);

  const bool p2p = opts.comm_algo == CocCommAlgo::kP2p && C > 1;
  // Under --bf16 the GEMMs read the gathered bf16 rows as they are (the bits of rounding their widened copy again);
  // the widened copy is then made only for whoever keeps it (`gathered`) or for the deterministic tiles.
  const bool collective16 = wire16(opts) && !p2p;
  const bool read16 = collective16 && gemm_compute_type() == DType::kBF16 && !opts.deterministic;
  // A caller's dense bf16 `gathered16` is the gather target itself under a bf16 wire: no fp32 copy at all.
  const bool g16_direct = collective16 && gathered16 && gathered16->ld == k;
  // The fp32 gather target must be one dense [m, k] buffer: the caller's `gathered` when it is, else a scratch
  // (not needed when the GEMMs read the bf16 rows and nobody keeps fp32 ones).
  Scratch g_buf;
  MatrixView g;
  const bool g_direct = gathered && is_contiguous(*gathered);
  if (g_direct) {
    g = *gathered;
  } else if (!read16 || gathered || (gathered16 && !g16_direct)) {
    g_buf = make_scratch(m * k);
    g = dense(g_buf.get(), m, k);
  }
  // The send rows must be dense too, and must not alias the receive buffer (MPI forbids it without
  // MPI_IN_PLACE; a caller may legitimately pass a = its own rows of `gathered`).
  // bf16 wire: the point-to-point schedule multiplies a rounded dense copy of a (and sends it as bf16).
  Scratch a_buf;
  const float* send = a.data;
  if (!is_contiguous(a) || overlaps(a, g) || (p2p && wire16(opts))) {
    a_buf = make_scratch(a.rows * k);
    copy_rows(a, dense(a_buf.get(), a.rows, k));
    if (p2p) round_for_wire(opts, dense(a_buf.get(), a.rows, k));
    send = a_buf.get();
  }
  // bf16 wire, collective schedule: a is rounded once into send16 and gathered into g16 ([m, k] bf16); each chunk
  // is widened into g when its gather is in, just before the GEMMs read it, where g is needed.
  Scratch send16, g16_buf;
  BFloat16* g16 = nullptr;
  if (collective16) {
    send16 = make_scratch16(a.rows * k);
    if (g16_direct) {
      g16 = gathered16->data;
    } else {
      g16_buf = make_scratch16(m * k);
      g16 = as16(g16_buf);
    }
    to_wire(a, as16(send16));
  }
  auto matmul_rows = [&](int64_t begin, int64_t count, MatrixView y) {
    if (read16)
      matmul(ConstBf16View{g16 + begin * k, count, k, k}, w, layout, y);
    else
      matmul(g.slice_rows(begin, count), w, layout, y);
  };
  auto widen = [&](int c) {
    if (!g16 || !g.data) return;
    for (int r = 0; r < T; ++r) {
      const RowRange sub = plan.sub(r, c);
      from_wire(g16 + sub.begin * k, g.slice_rows(sub.begin, sub.count));
    }
  };
  // The bf16 `gathered16` of the paths that did not gather into it: rounded from g (exact under a bf16 wire).
  auto fill_gathered16 = [&] {
    if (gathered16 && !g16_direct) round_into(g, *gathered16);
  };
  std::optional<TileSchedule> tiles;
  if (opts.deterministic) tiles.emplace(plan, /*compute_first=*/false);

  auto post = [&](int c) {
    std::vector<int64_t> counts(Tz), displs(Tz);
    for (int r = 0; r < T; ++r) {
      const RowRange sub = plan.sub(r, c);
      counts[static_cast<size_t>(r)] = sub.count * k;
      displs[static_cast<size_t>(r)] = sub.begin * k;  // rank-major rows of the full matrix: no un-shuffle
    }
    const RowRange mine = plan.sub(me, c);
    const int64_t from = (mine.begin - share.begin) * k;
    const std::string tag = chunk_tag(op, opts, c, C, plan.chunk_rows(c), k);
    const bool blocking = C == 1 && !opts.nonblocking_serial;
    if (g16) return group.all_gather(as16(send16) + from, g16, counts, displs, tag, blocking);
    return group.all_gather(send + from, g.data, counts, displs, tag, blocking);
  };

  if (p2p) {
    // Under a bf16 wire `send` is the rounded copy, and the schedule multiplies our own rows from it too.
    const ConstMatrixView own_a = wire16(opts) ? ConstMatrixView{send, a.rows, k, k} : a;
    all_gather_matmul_p2p(group, own_a, w, layout, out, bias, g, send, plan, opts, st);
    finish(opts, {0, m});
    // The _v2 output needs our own rows too; the p2p schedule multiplies them straight from `a` (deterministic mode
    // has placed them already).
    MatrixView own = g.slice_rows(share.begin, share.count);
    if ((gathered || gathered16) && !opts.deterministic && own.data != own_a.data) copy_rows(own_a, own);
    if (gathered && !g_direct) copy_rows(g, *gathered);
    fill_gathered16();
    commit_stats(opts, st);
    return CocPending();
  }

  Work cur, next;
  try {
    cur = post(0);
    if (C == 1 && opts.nonblocking_serial && opts.during_gather) progress_during(group, opts.during_gather);
    for (int c = 0; c < C; ++c) {
      next = c + 1 < C ? post(c + 1) : Work();  // AG c+1 in flight while chunk c computes
      {
        Stopwatch sw;
        cur.wait();
        st.comm_wait_s += sw.seconds();
      }
      widen(c);
      if (tiles) {
        Stopwatch sw;
        gemm_tiles(*tiles, tiles->tiles_for(c), g, w, layout, out, bias);
        st.gemm_s += sw.seconds();
        for (int64_t t : tiles->tiles_for(c)) finish(opts, tiles->rows(t));
      } else if (C == 1) {
        // Serial: all m rows are in, in order; one GEMM (splitting thin m into T calls costs OpenBLAS up to 25%).
        Stopwatch sw;
        matmul_rows(0, m, out);
        st.gemm_s += sw.seconds();
        if (bias) add_bias(out, bias);
        finish(opts, {0, m});
      } else {
        for (int r = 0; r < T; ++r) {
          const RowRange sub = plan.sub(r, c);
          if (sub.count == 0) continue;
          MatrixView y = out.slice_rows(sub.begin, sub.count);
          Stopwatch sw;  // the GEMM only: MPI progress below is not GEMM time (and --profile's gemm events agree)
          matmul_rows(sub.begin, sub.count, y);
          st.gemm_s += sw.seconds();
          if (bias) add_bias(y, bias);  // no reduction follows, so the bias goes in while the rows are hot
          finish(opts, sub);  // and the caller's epilogue (CocOptions::finish_rows)
          progress(group);
        }
      }
      progress(group);
      cur = std::move(next);
      next = Work();
    }
  } catch (...) {
    std::vector<Work> live{cur, next};
    drain_after_error(live, std::current_exception());
    throw;
  }
  if (gathered && !g_direct) copy_rows(g, *gathered);
  fill_gathered16();
  st.chunks = C;
  commit_stats(opts, st);
  return CocPending();  // every gather was waited before its GEMM: nothing left in flight
}

// One agreement id for both forms: they post the same collectives (v2 only keeps the gathered rows).
constexpr CocOpDesc kDesc{.name = "all_gather_matmul",
                          .id = 3,
                          .gathers = true,
                          .chunks_all_rows = false,
                          .has_p2p = true,
                          .pipeline = "communicate-first: the all-gather of chunk i+1 overlaps the GEMMs of chunk i",
                          .validate = validate,
                          .fused = fused,
                          .chunked = chunked};
constexpr CocOpDesc kDescV2 = [] {
  CocOpDesc d = kDesc;
  d.name = "all_gather_matmul_v2";
  return d;
}();
}  // namespace

CocPending all_gather_matmul_async(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                                   MatrixView out, const float* bias, MatrixView* gathered, const CocOptions& opts) {
  return run_coc_op(gathered ? kDescV2 : kDesc, group, {a, w, layout, out, bias, gathered}, opts);
}

void all_gather_matmul(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                       MatrixView out, const float* bias, const CocOptions& opts) {
  run_coc_op(kDesc, group, {a, w, layout, out, bias}, opts).wait();
}

void all_gather_matmul_v2(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                          MatrixView out, MatrixView gathered, const float* bias, const CocOptions& opts) {
  run_coc_op(kDescV2, group, {a, w, layout, out, bias, &gathered}, opts).wait();
}

void all_gather_matmul_v2(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                          MatrixView out, Bf16View gathered, const float* bias, const CocOptions& opts) {
  if (gemm_compute_type() != DType::kBF16)
    throw_invalid("rank {}: all_gather_matmul_v2 with a bf16 gathered input [{}, {}] needs bf16 GEMMs (--bf16); "
                  "the compute type is {}: pass an fp32 gathered buffer",
                  group.rank(), gathered.rows, gathered.cols, to_string(gemm_compute_type()));
  run_coc_op(kDescV2, group, {a, w, layout, out, bias, nullptr, &gathered}, opts).wait();
}

}  // namespace coc
