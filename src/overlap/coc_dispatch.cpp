// The path every CoC op call takes before its own schedule (coc_internal.h, run_coc_op): one place for what the
// ops share, so that each op file holds only its checks and its schedules, and an op runs on whatever group it
// is given. PyTorch c10d does the same for its collectives: ProcessGroupNCCL::collective(input, output, fn, pre,
// post, opType) wraps every op in one prologue and epilogue.
#include <fmt/format.h>

#include <algorithm>

#include "coc/core/bf16.h"
#include "coc/runtime/tracer.h"
#include "coc_internal.h"
#include "fused_internal.h"

namespace coc::detail {

CocStats call_stats(const Schedule& s) {
  CocStats st;
  st.calls = 1;
  st.gflop = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k) * 1e-9;
  st.serial_fallbacks = s.serial_fallback ? 1 : 0;
  return st;
}

void produce(const CocOptions& opts, RowRange rows, int64_t m) {
  if (!opts.produce_rows || rows.count <= 0) return;
  if (m > 0) {
    const int64_t b = rows.begin / kDeterministicTileRows * kDeterministicTileRows;
    const int64_t e = std::min(m, (rows.end() + kDeterministicTileRows - 1) / kDeterministicTileRows *
                                      kDeterministicTileRows);
    rows = {b, e - b};
  }
  // The producer's work is the caller's, not the op's: its events carry no "op" arg, as CocStats' GEMM timer does
  // not count it either.
  const trace::Context outside_the_op(nullptr);
  opts.produce_rows(rows);
}

void finish(const CocOptions& opts, RowRange rows) {
  if (!opts.finish_rows || rows.count <= 0) return;
  const trace::Context outside_the_op(nullptr);  // the caller's work, as the producer's (produce)
  opts.finish_rows(rows);
}

CocPending run_coc_op(const CocOpDesc& op, Communicator& group, const CocCall& call, const CocOptions& opts) {
  const int64_t m = op.gathers ? call.out.rows : call.a.rows, k = call.a.cols, n = weight_n(call.w, call.layout);
  // The dimension every rank passes alike, and the one that may differ between ranks (uneven feature splits).
  const int64_t agreed = op.gathers ? k : n, local = op.gathers ? n : k;
  if (opts.customized)  // MindSpeed's customized_coc: the table's N for this shape, then the usual path
    return run_coc_op(op, group, call, apply_customized(opts, m, k, n));
  if (opts.produce_rows && (op.gathers || group.size() == 1 || m == 0)) {
    // Nothing to pipeline the producer with (the all-gather ops' a is this rank's input, not a GEMM's rows).
    CocOptions o = opts;
    o.produce_rows = nullptr;
    produce(opts, {0, call.a.rows});
    return run_coc_op(op, group, call, o);
  }
  if (opts.parallel_num == CocOptions::kAuto) {
    const int64_t rows_per_rank = op.chunks_all_rows ? m : split_rows(m, group.size(), 0).count;
    const CocOptions chosen = resolve_auto(
        group, op.name, m, agreed, local, rows_per_rank, op.has_p2p, opts,
        [&](const CocOptions& o) { run_coc_op(op, group, call, o).wait(); }, [&] { produce(opts, {0, m}); });
    return run_coc_op(op, group, call, chosen);
  }
  const int T = group.size(), me = group.rank();
  const std::string label = op_label(op.name, opts, me);
  const trace::Context trace_op(op.name);
  COC_TRACE_SCOPE(trace::Cat::kHost, trace::Level::kLevel1, op.name, {"m", m}, {"k", k}, {"n", n});
  {
    const int64_t key[] = {op.id, m, agreed, opts.parallel_num, opts.min_chunk_rows, opts.deterministic ? 1 : 0,
                           opts.fused ? 1 : 0, static_cast<int64_t>(opts.comm_dtype)};
    agree_on_arguments(group, label, op.validate(call, T, me, opts), key,
                       fmt::format("this rank: m={} {}={} N={} min_chunk_rows={} deterministic={} fused={} "
                                   "comm_dtype={}",
                                   m, op.gathers ? "k" : "n", agreed, opts.parallel_num, opts.min_chunk_rows,
                                   opts.deterministic, opts.fused, to_string(opts.comm_dtype)));
  }
  const bool own_rows = !op.chunks_all_rows || opts.comm_algo == CocCommAlgo::kP2p;
  const Schedule s = choose_schedule(op.name, m, k, n, own_rows ? split_rows(m, T, 0).count : m, T, opts,
                                     op.pipeline);
  CocStats st = call_stats(s);

  // The fused kernel finishes the op (bias included) before returning.
  const auto fused = [&] {
    produce(opts, {0, m});  // the fused kernel reads a whole
    return op.fused(group, call, opts, st);
  };
  // The paths below finish the whole output at once (CocOptions::finish_rows): the gathering ops leave nothing in
  // flight.
  const auto finish_all = [&] {
    if (op.gathers) finish(opts, {0, m});
  };
  if (run_fused_if_requested(group, op.name, m, opts, st, fused)) {
    finish_all();
    return CocPending();
  }
  if (T == 1 || m == 0) {  // nothing to communicate: a holds all m rows
    if (call.gathered) copy_rows(call.a, *call.gathered);
    if (call.gathered16) {
      COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "fp32_to_bf16", {"elements", m * call.a.cols});
      fp32_to_bf16_rows(call.a.data, call.a.ld, call.gathered16->data, call.gathered16->ld, m, call.a.cols);
    }
    CocPending done = run_unchunked(group, s, call.a, call.w, call.layout, call.out, call.bias, opts, st);
    finish_all();
    return done;
  }
  return op.chunked(group, call, s, opts, st);
}

}  // namespace coc::detail
