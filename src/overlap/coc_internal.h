// Private helpers shared by the CoC ops (src/overlap/*.cpp): the shared path every op call takes (run_coc_op),
// scratch buffers, view checks, the choice of the effective chunk count and its verbose explanation, argument
// agreement across ranks, the deterministic GEMM tiling and the rank-ordered sum. Not installed; nothing outside
// src/overlap/ includes it. `group` is the communicator an op runs on (T = group.size()): the TP group for the
// layers, but any group works.
#pragma once

#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "coc/comm/communicator.h"
#include "coc/comm/progress.h"
#include "coc/core/tensor.h"
#include "coc/kernels/gemm.h"
#include "coc/overlap/coc_ops.h"
#include "coc/overlap/partition.h"

namespace coc::detail {

// ---- buffers and views -------------------------------------------------------------------------------------

/// An uninitialised, 64-byte aligned fp32 buffer. Shared, because a buffer that MPI reads or writes must outlive
/// the op's Work: completion steps (Work::then) capture it and drop their reference once they ran.
using Scratch = std::shared_ptr<float>;
/// `elems` floats, uninitialised (every scratch is fully overwritten before it is read, so no memset).
Scratch make_scratch(int64_t elems);

/// True when rows are back to back in memory (ld == cols), so that the view is one MPI buffer.
inline bool is_contiguous(ConstMatrixView v) { return v.rows <= 1 || v.ld == v.cols; }
/// A contiguous [rows, cols] view over raw memory.
inline MatrixView dense(float* p, int64_t rows, int64_t cols) { return {p, rows, cols, cols}; }
/// dst = src, same shape; either may be strided.
void copy_rows(ConstMatrixView src, MatrixView dst);
/// True when the memory spans of the two views intersect (empty views never do).
bool overlaps(ConstMatrixView x, ConstMatrixView y);

/// Empty when `v` is a well-formed view (non-negative shape, ld >= cols, data set when non-empty); otherwise a
/// sentence naming `what`.
std::string check_view(ConstMatrixView v, const char* what);

/// The checks every op starts with: the options, the views of a, w and out, and a's columns against the weight's k
/// under `layout`. Empty when all hold; otherwise the sentence to report.
std::string check_gemm_operands(ConstMatrixView a, ConstMatrixView w, WeightLayout layout, ConstMatrixView out,
                                const CocOptions& opts);
/// The compute-first ops' last check: empty unless `out` overlaps a or w (the GEMM would overwrite its own inputs);
/// then the sentence to report.
std::string check_out_apart(ConstMatrixView out, ConstMatrixView a, ConstMatrixView w);

/// CocOptions::produce_rows for `rows` of a, if the caller gave a producer. `m` > 0 (deterministic mode) widens
/// the range to the kDeterministicTileRows tiles that the GEMMs over it compute, capped at m rows.
void produce(const CocOptions& opts, RowRange rows, int64_t m = 0);
/// CocOptions::finish_rows for `rows` of out, if the caller gave one (count > 0).
void finish(const CocOptions& opts, RowRange rows);

// ---- the 16-bit wire (CocOptions::comm_dtype) ------------------------------------------------------------------

/// True when the op moves bf16 (CocOptions::comm_dtype == kBF16).
inline bool wire16(const CocOptions& opts) { return opts.comm_dtype == DType::kBF16; }
/// `elems` bf16 elements of uninitialised scratch from make_scratch's pool (reused across calls: no heap churn on
/// the hot path); as16 gives the element pointer.
Scratch make_scratch16(int64_t elems);
inline BFloat16* as16(const Scratch& s) { return reinterpret_cast<BFloat16*>(s.get()); }
/// dst (dense [src.rows, src.cols] bf16) = src rounded to nearest even (bf16.h); src may be strided.
void to_wire(ConstMatrixView src, BFloat16* dst);
/// dst = src widened to fp32 (exact); src dense [dst.rows, dst.cols] bf16, dst may be strided.
void from_wire(const BFloat16* src, MatrixView dst);
/// x = bf16(x) in place when `opts` move bf16 (the value a bf16 transfer delivers), else nothing: the paths whose
/// transport is fp32-only round what they send, so that their bits are those of the paths that move bf16.
void round_for_wire(const CocOptions& opts, MatrixView x);

// ---- rank-ordered reduction (deterministic mode) --------------------------------------------------------------

/// out[i, j] = (((p_0[i, j] + p_1[i, j]) + p_2[i, j]) + ...) + p_{T-1}[i, j], where p_r is the contiguous
/// [out.rows, out.cols] block at parts + r·part_stride. The order of additions per element is fixed (rank order,
/// starting from rank 0's value), so the result depends only on the values, never on timing or chunking.
void sum_in_rank_order(const float* parts, int T, int64_t part_stride, MatrixView out);
/// The same over bf16 partials (a bf16 wire's deterministic reductions): widened into pooled fp32 scratch, summed
/// in rank order, and the sum rounded once to bf16.
void sum16_in_rank_order(const BFloat16* parts, int T, int64_t part_stride, MatrixView out);

/// The deterministic all-reduce: the out.rows · out.cols contiguous fp32 elements at `src` are all-gathered from
/// every rank into a [T, rows, cols] scratch and summed in rank order (sum_in_rank_order) into `out` in the Work's
/// completion step. `keep` is the scratch `src` lives in (or empty), held until then: MPI reads it until the
/// gather completes. Collective over `group`; the tag names the op in traces and errors.
/// With `wire` = kBF16 the gather moves bf16 (src rounded into pooled staging first) and the completion step sums
/// the widened partials in rank order in fp32 and rounds the sum once to bf16: bitwise sum_in_rank_order of the
/// rounded partials, then round_to_bf16.
Work all_gather_then_sum(Communicator& group, const float* src, MatrixView out, Scratch keep, const std::string& tag,
                         DType wire = DType::kF32);

// ---- schedule choice --------------------------------------------------------------------------------------

/// The schedule one call runs, decided from the shapes and options alone, hence identical on every rank.
struct Schedule {
  const char* op = "";        ///< "matmul_all_reduce", ...
  int64_t m = 0, k = 0, n = 0;
  int tp = 1;                 ///< T, the group size (verbose lines call it tp)
  int requested = 1;          ///< opts.parallel_num
  int effective = 1;          ///< chunks actually run
  bool serial_fallback = false;
  std::vector<std::string> reasons;  ///< only filled when verbose logging is on
};

/// Chooses the effective N. `rows_per_rank` is the number of rows one rank chunks: m for the all-reduce (every
/// rank computes all m rows), the largest share ceil(m/T) for reduce-scatter and all-gather. N is lowered to
/// rows_per_rank when m is small, then further until every chunk has >= opts.min_chunk_rows rows per rank.
/// Assumes opts were validated (parallel_num >= 1, min_chunk_rows >= 1).
Schedule choose_schedule(const char* op, int64_t m, int64_t k, int64_t n, int64_t rows_per_rank, int tp,
                         const CocOptions& opts, const char* pipeline);

/// One verbose line per distinct schedule (rank 0 of the group only: the schedule is identical on every rank);
/// a training loop's later calls with the same op, tag, shape and N print nothing (first_occurrence).
void log_schedule(const Communicator& group, const Schedule& s, const ChunkPlan* plan, const CocOptions& opts);

/// True the first time `line` is passed in this process (thread-safe): verbose lines that would repeat every
/// iteration are printed once. Remembers at most 4096 lines, then says true again for new ones only.
bool first_occurrence(const std::string& line);

/// "matmul_all_reduce 'tag' (rank 1)": the prefix of every error message.
std::string op_label(const char* op, const CocOptions& opts, int rank);

/// Empty when N and min_chunk_rows are valid, else the sentence to throw.
std::string check_options(const CocOptions& opts);

/// Throws the uniform kInvalidArgument error `err` when it is non-empty. With --debug-collectives
/// (check_fingerprints) and T > 1 it first checks that every rank passes the same `key` (a hash of the op's
/// global shape and options, plus whether this rank's arguments were valid), so that a rank with bad arguments
/// or a different m makes every rank throw a uniform error instead of leaving its peers inside a collective.
void agree_on_arguments(Communicator& group, const std::string& label, const std::string& err,
                        std::span<const int64_t> key, const std::string& key_desc);

// ---- deterministic GEMM tiling ------------------------------------------------------------------------------

/// Which tiles each chunk computes. Every row of [0, m) belongs to exactly one plan sub-block; a tile runs with
/// the first chunk that owns one of its rows (compute-first: all of a chunk's rows must be computed before its
/// collective is posted) or with the last one (communicate-first: all of a tile's input rows must have arrived).
class TileSchedule {
 public:
  TileSchedule(const ChunkPlan& plan, bool compute_first);
  /// Tile indices to compute for chunk c, ascending.
  const std::vector<int64_t>& tiles_for(int c) const { return by_chunk_[static_cast<size_t>(c)]; }
  /// Rows of tile t in the full matrix.
  RowRange rows(int64_t t) const;

 private:
  int64_t m_;
  std::vector<std::vector<int64_t>> by_chunk_;
};

/// y rows of every tile in `tiles` = x rows · W (one GEMM call per tile); x [m, k] and y [m, n] are full
/// matrices. Returns the number of rows computed. If bias is set, it is added to the computed rows.
int64_t gemm_tiles(const TileSchedule& ts, const std::vector<int64_t>& tiles, ConstMatrixView x, ConstMatrixView w,
                   WeightLayout layout, MatrixView y, const float* bias = nullptr);

/// The same tiles for the point-to-point schedules, which visit rows in an order of their own (p2p_schedules.cpp):
/// each tile is computed once, by the first cover() whose rows it intersects, so the bits are those of every other
/// deterministic schedule. Used only where all of x is present from the start (the remote-first reduce-scatter and
/// all-reduce); the all-gather, whose rows arrive, uses ready_tiles().
class TileCover {
 public:
  explicit TileCover(int64_t m);
  /// y rows of every tile intersecting `rows` that no earlier call computed = x rows · W (one GEMM call per tile);
  /// x [m, k] and y [m, n] are full matrices. Returns the number of rows computed.
  int64_t cover(RowRange rows, ConstMatrixView x, ConstMatrixView w, WeightLayout layout, MatrixView y);

 private:
  int64_t m_;
  std::vector<char> done_;
};

/// For a local-first all-gather over `plan` (rank `me`'s rows present from the start, the peers' rows of chunk c
/// arriving with exchange c): element 0 lists the tiles made of this rank's rows only, element c + 1 those whose
/// last peer rows arrive with chunk c. Every tile is in exactly one list, ascending.
std::vector<std::vector<int64_t>> ready_tiles(const ChunkPlan& plan, int me);

/// Rows of tile t of a matrix with m rows.
RowRange tile_rows(int64_t t, int64_t m);

// ---- timing and error draining ----------------------------------------------------------------------------

/// Seconds since construction (steady clock).
struct Stopwatch {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

/// Adds `local` into opts.stats, if set.
inline void commit_stats(const CocOptions& opts, const CocStats& local) {
  if (opts.stats) *opts.stats += local;
}


/// T == 1 or m == 0: nothing to communicate, so one GEMM plus the bias, as Megatron does with tp = 1. Logs the
/// schedule, fills and commits `st`, and returns an already complete CocPending.
CocPending run_unchunked(const Communicator& group, const Schedule& s, ConstMatrixView a, ConstMatrixView w,
                         WeightLayout layout, MatrixView out, const float* bias, const CocOptions& opts, CocStats st);

// ---- automatic choice (auto_schedule.cpp) ----------------------------------------------------------------

/// opts without its customized table, and with parallel_num taken from it when this rank's GEMM shape [m, k]·[k, n]
/// is in it. The ops call themselves again with the result, so the table is consulted once per call.
CocOptions apply_customized(const CocOptions& opts, int64_t m, int64_t k, int64_t n);

/// Resolves CocOptions::kAuto: returns `opts` with parallel_num >= 1 and comm_algo set, identical on every rank
/// (rank 0 decides and broadcasts). The first call per (communicator, op, m, dim, deterministic) may run `run` —
/// the op itself, to completion, with non-auto options — once per candidate and round; later calls hit a cache.
/// `dim` is the dimension the op agrees on besides m (n for the reduce ops, k for the all-gather), `local_dim` this
/// rank's own one (k for the reduce ops, n for the all-gather; ranks may differ, the maximum is used);
/// `rows_per_rank` the rows one rank chunks; `before_trials` (may be empty) runs once, untimed, before the first
/// trial (the caller's CocOptions::produce_rows, whose rows every trial reads). Collective over `group` on every call
/// (one 8-byte all-reduce).
CocOptions resolve_auto(Communicator& group, const char* op, int64_t m, int64_t dim, int64_t local_dim,
                        int64_t rows_per_rank, bool has_p2p, const CocOptions& opts,
                        const std::function<void(const CocOptions&)>& run,
                        const std::function<void()>& before_trials = {});

// ---- the shared path of every CoC op (coc_dispatch.cpp) -----------------------------------------------------

/// The arguments of one CoC call, as the coc_ops.h forms take them. `gathered` is all_gather_matmul_v2's [m, k]
/// output and null for every other op.
struct CocCall {
  ConstMatrixView a;
  ConstMatrixView w;
  WeightLayout layout = WeightLayout::kNK;
  MatrixView out;
  const float* bias = nullptr;
  MatrixView* gathered = nullptr;
  /// All-gather v2 under --bf16 only: receives AG(a) rounded to bf16 instead of `gathered` (coc_ops.h).
  Bf16View* gathered16 = nullptr;
};

/// What one op brings to the shared path: its name and agreement id, which dimensions it agrees on, its rows
/// rule, its checks, its fused kernel and its chunked schedule. Each op file defines one (the all-gather two).
struct CocOpDesc {
  const char* name;  ///< "matmul_reduce_scatter": errors, verbose lines, trace events and the auto-choice cache
  int64_t id;        ///< first element of the argument-agreement key (1 AR, 2 RS, 3 AG and AG v2)
  /// The all-gather: m is out's rows and the ranks agree on k (n may differ per rank). Otherwise m is a's rows and
  /// the ranks agree on n (k may differ per rank: an uneven split of the input features).
  bool gathers;
  /// Every rank chunks all m rows (the collective all-reduce); otherwise, and in point-to-point mode, it chunks
  /// its share, split_rows(m, T, 0) rows at most. The rows_per_rank of resolve_auto and choose_schedule.
  bool chunks_all_rows;
  bool has_p2p;          ///< has a point-to-point schedule (CocCommAlgo::kP2p; resolve_auto's candidates)
  const char* pipeline;  ///< choose_schedule's sentence for the overlapped schedule
  /// Empty when the call's arguments are valid on rank `me` of a group of T; otherwise the sentence to report.
  std::string (*validate)(const CocCall& call, int T, int me, const CocOptions& opts);
  /// The fused node-shared kernel (fused_internal.h); false, having done nothing, when its window cannot grow.
  bool (*fused)(Communicator& group, const CocCall& call, const CocOptions& opts, CocStats& st);
  /// The chunked schedule (collective, deterministic or point-to-point, as opts say) for T > 1 and m > 0, with
  /// s.effective chunks: logs the schedule, runs it, fills and commits `st` (calls, gflop and serial_fallbacks
  /// already set) and returns what is still in flight.
  CocPending (*chunked)(Communicator& group, const CocCall& call, const Schedule& s, const CocOptions& opts,
                        CocStats& st);
};

/// One call of a CoC op, the way PyTorch c10d's collective(input, output, fn, pre, post, opType) serves every
/// collective: MindSpeed's customized_coc table, then the automatic choice (both re-enter this function with the
/// resulting options), the trace context, the argument agreement (op.validate; --debug-collectives), the schedule
/// choice, the stats, the fused kernel when requested, the unchunked form when T == 1 or m == 0 (`gathered`
/// receives a), and otherwise op.chunked. Throws the uniform kInvalidArgument error of agree_on_arguments.
CocPending run_coc_op(const CocOpDesc& op, Communicator& group, const CocCall& call, const CocOptions& opts);

/// The stats of one call that ran schedule `s`: calls = 1, the GEMM work of [m, k]·[k, n] and whether it is a
/// serial fallback. The times and chunks are the schedule's to fill.
CocStats call_stats(const Schedule& s);

// ---- point-to-point schedules (p2p_schedules.cpp) ----------------------------------------------------------

/// matmul_reduce_scatter over point-to-point messages (Communicator::exchange_recvs/exchange_sends), remote-first:
/// every receive is posted first, the peers' rows are computed and sent chunk by chunk (chained), this rank's rows
/// last, each reduced as soon as its partials are in: accumulated onto the received partial (beta = 1, ready
/// chunks merged into one GEMM with the thread engine) or, in deterministic mode or into a strided `out`, summed in
/// rank order. Waits for everything and adds the bias before returning. In deterministic mode the GEMMs run in the
/// fixed tiles (TileCover).
void matmul_reduce_scatter_p2p(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                               MatrixView out, const float* bias, const ChunkPlan& plan, const CocOptions& opts,
                               CocStats& st);
/// all_gather_matmul over Communicator::exchange (every receive posted first, sends chained), local-first: this
/// rank's rows (`a`) are multiplied while the peers' chunks arrive into `g` ([m, k], dense), each multiplied once
/// in (with the thread engine, own rows in one GEMM and the chunks already in merged). `send` is a dense copy of
/// a's rows (or a itself). The caller fills g's own rows when it needs them (the _v2 output), except in deterministic mode,
/// which places them first (its fixed tiles may mix own and peer rows: ready_tiles). Waits for everything.
void all_gather_matmul_p2p(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                           MatrixView out, const float* bias, MatrixView g, const float* send,
                           const ChunkPlan& plan, const CocOptions& opts, CocStats& st);

/// matmul_all_reduce over Communicator::exchange_recvs/exchange_sends: the remote-first reduce-scatter of
/// matmul_reduce_scatter_p2p (without merging, so that each chunk is sent on as soon as it is reduced) over
/// `plan` (ChunkPlan(m, T, N): rank-major shares), then each reduced chunk of this rank's share (+ bias) is sent to
/// every peer while the next one computes, and the peers' reduced rows arrive into theirs. `out` [m, n] may be
/// strided (a dense stand-in receives). Waits for everything. In deterministic mode the GEMMs run in the fixed tiles.
void matmul_all_reduce_p2p(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                           MatrixView out, const float* bias, const ChunkPlan& plan, const CocOptions& opts,
                           CocStats& st);

/// Chunk label for the flight recorder and errors: "<tag or op> chunk 2/4 [125, 64]".
std::string chunk_tag(const char* op, const CocOptions& opts, int c, int chunks, int64_t rows, int64_t cols);

}  // namespace coc::detail
