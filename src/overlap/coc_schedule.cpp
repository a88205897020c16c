// The effective chunk count of a CoC call and the verbose line that says which schedule ran and why
// (edge cases 11 and 12 of docs/edge-cases.md: a fallback to serial must never be silent). Also the shared
// error-message prefix.
//
// MindSpeed allows only N in {1, 2, 4, 8} and silently falls back to N = 1 when m < N
// (mindspeed/core/tensor_parallel/lcal_coc/coc_utils.py); we accept any N >= 1, lower it to the number of rows
// when m is small, and lower it further to honour CocOptions::min_chunk_rows (ours).
#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <string_view>

#include "coc/core/error.h"
#include "coc/core/log.h"
#include "coc_internal.h"

namespace coc::detail {

std::string op_label(const char* op, const CocOptions& opts, int rank) {
  if (opts.tag.empty()) return fmt::format("{} (rank {})", op, rank);
  return fmt::format("{} '{}' (rank {})", op, opts.tag, rank);
}

std::string chunk_tag(const char* op, const CocOptions& opts, int c, int chunks, int64_t rows, int64_t cols) {
  return fmt::format("{} chunk {}/{} [{}, {}]", opts.tag.empty() ? op : opts.tag, c + 1, chunks, rows, cols);
}

std::string check_options(const CocOptions& opts) {
  if (opts.parallel_num < 1 && opts.parallel_num != CocOptions::kAuto)
    return fmt::format("parallel_num (--coc-parallel-num) must be >= 1 or auto, got {}; use 1 for the plain "
                       "Megatron order (no overlap), 2..16 to overlap, or auto to let coc time the choices",
                       opts.parallel_num);
  if (opts.min_chunk_rows < 1)
    return fmt::format("min_chunk_rows must be >= 1, got {}; use 1 to disable the serial fallback",
                       opts.min_chunk_rows);
  if (opts.comm_dtype != DType::kF32 && opts.comm_dtype != DType::kBF16)
    return fmt::format("comm_dtype must be fp32 or bf16, got {}; the CoC ops move fp32 or bf16 over the wire",
                       to_string(opts.comm_dtype));
  return {};
}

Schedule choose_schedule(const char* op, int64_t m, int64_t k, int64_t n, int64_t rows_per_rank, int tp,
                         const CocOptions& opts, const char* pipeline) {
  Schedule s;
  s.op = op;
  s.m = m;
  s.k = k;
  s.n = n;
  s.tp = tp;
  s.requested = opts.parallel_num;
  const bool explain = log::level() >= 2;  // the reasons cost string formatting; build them only when shown
  auto why = [&](std::string r) {
    if (explain) s.reasons.push_back(std::move(r));
  };
  if (tp == 1) {
    s.effective = 1;
    why("tp=1: no communication, one local GEMM");
    return s;
  }
  if (m == 0) {
    s.effective = 1;
    why("m=0: nothing to compute");
    return s;
  }
  int64_t eff = s.requested;
  if (eff == CocOptions::kAuto) {  // only ops without an auto choice get here (w8a16, fused fallbacks)
    eff = 4;
    why("auto: this op has no timed choice; N=4");
  }
  if (eff == 1) why("N=1: plain Megatron order, no overlap (one blocking collective)");
  if (rows_per_rank < eff) {
    if (rows_per_rank == m)
      why(fmt::format("m={} < N={}: {} chunk{}", m, eff, rows_per_rank, rows_per_rank == 1 ? "" : "s"));
    else
      why(fmt::format("rows per rank {} (m={} over tp={}) < N={}: {} chunk{}", rows_per_rank, m, tp, eff,
                      rows_per_rank, rows_per_rank == 1 ? "" : "s"));
    eff = rows_per_rank;
  }
  if (opts.min_chunk_rows > 1 && rows_per_rank / eff < opts.min_chunk_rows) {
    int64_t lowered = std::max<int64_t>(1, rows_per_rank / opts.min_chunk_rows);
    why(fmt::format("min_chunk_rows={}: N lowered {}->{} ({} rows per rank)", opts.min_chunk_rows, eff, lowered,
                    rows_per_rank));
    eff = lowered;
  }
  s.effective = static_cast<int>(eff);
  s.serial_fallback = s.effective == 1 && s.requested > 1;
  if (s.serial_fallback) why("serial fallback: one GEMM then one collective");
  if (s.effective > 1) why(pipeline);
  if (s.effective > 1 && opts.comm_algo == CocCommAlgo::kP2p) {
    why(std::string("point-to-point schedule (remote rows first for reduce-scatter and all-reduce, own rows first "
                    "for all-gather)") +
        (opts.deterministic ? ", GEMMs in the deterministic tiles" : ""));
  }
  return s;
}

void log_schedule(const Communicator& group, const Schedule& s, const ChunkPlan* plan, const CocOptions& opts) {
  if (log::level() < 2 || group.rank() != 0) return;
  std::string rows = "-";
  if (plan && plan->chunks() > 0) {
    // Rows per rank and chunk: rank 0's sub-blocks are the largest (partition.h).
    int64_t lo = INT64_MAX, hi = 0;
    for (int c = 0; c < plan->chunks(); ++c) {
      int64_t r = plan->sub(0, c).count;
      lo = std::min(lo, r);
      hi = std::max(hi, r);
    }
    rows = lo == hi ? fmt::format("{}", lo) : fmt::format("{}..{}", lo, hi);
  }
  // The all-gather has no reduction: in deterministic mode only its GEMM tiling is fixed.
  const bool reduces = std::string_view(s.op).rfind("all_gather", 0) != 0;
  const std::string mode =
      !opts.deterministic ? std::string("non-deterministic")
                          : fmt::format("deterministic (fixed {}-row GEMM tiles{})", kDeterministicTileRows,
                                        reduces ? ", rank-ordered sum" : "");
  std::string reasons;
  for (const auto& r : s.reasons) reasons += (reasons.empty() ? "" : "; ") + r;
  const std::string line =
      fmt::format("coc {}{}: m={} k={} n={} tp={} N={} effective={} chunk rows/rank={}{} {}: {}", s.op,
                  opts.tag.empty() ? "" : " '" + opts.tag + "'", s.m, s.k, s.n, s.tp, s.requested, s.effective, rows,
                  opts.last_rows_first ? " (last rows first)" : "", mode, reasons);
  if (first_occurrence(line)) log::verbose("{}", line);
}

bool first_occurrence(const std::string& line) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (seen.size() >= 4096) return !seen.contains(line);
  return seen.insert(line).second;
}

CocPending run_unchunked(const Communicator& group, const Schedule& s, ConstMatrixView a, ConstMatrixView w,
                         WeightLayout layout, MatrixView out, const float* bias, const CocOptions& opts, CocStats st) {
  log_schedule(group, s, nullptr, opts);
  Stopwatch sw;
  matmul(a, w, layout, out);
  if (bias) add_bias(out, bias);
  st.gemm_s = sw.seconds();
  st.chunks = a.rows > 0 ? 1 : 0;
  commit_stats(opts, st);
  return CocPending();
}

}  // namespace coc::detail

namespace coc {

CocCommAlgo parse_comm_algo(const std::string& s) {
  if (s == "collective") return CocCommAlgo::kCollective;
  if (s == "p2p") return CocCommAlgo::kP2p;
  throw_invalid("unknown --coc-comm-algo '{}'; use 'collective' (one MPI collective per chunk, MindSpeed's CoC) or "
                "'p2p' (point-to-point: remote rows first for reduce-scatter and all-reduce, own rows first for "
                "all-gather)",
                s);
}

const char* to_string(CocCommAlgo a) { return a == CocCommAlgo::kP2p ? "p2p" : "collective"; }

}  // namespace coc
