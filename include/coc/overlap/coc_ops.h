// The CoC ops: a GEMM and a collective over a group, chunked along m so that the collective of one chunk runs while
// the next chunk computes (MindSpeed's "script mode" CoC, mindspeed/core/tensor_parallel/lcal_coc/ and
// coc_parallel_linears_*; docs/semantics.md §1 and §3). These are also the fused-op API of docs/semantics.md §3:
// with CocOptions::fused they run the node-local shared-memory implementation ("fused kernel", fused_ops.h) instead
// of the chunked pipeline, behind the same signatures.
//
// `group` is the communicator the op runs on: the TP group for the layers (linear.h), but any group works (a DP,
// CP or EP group, any Communicator::split): nothing in the ops is specific to tensor parallelism. Every rank of
// `group` makes the call. Verbose lines and errors call T "tp" whatever the group.
//
// Notation: group size T (`group.size()`), chunk count N (`opts.parallel_num`). `a` is the left matrix [m, k]
// (tokens × in-features), `w` the weight, read with an explicit WeightLayout ([n,k] or [k,n]); `out` is
// caller-allocated. Row order after an all-gather is rank-major, as in Megatron. Rank r's share of m rows is
// split_rows(m, T, r) (partition.h): uneven shares are allowed, so any m >= 1 works with any T and N.
//
// Schedules:
//  - compute-first (matmul_all_reduce, matmul_reduce_scatter): for each chunk, GEMM it, then post its
//    collective; GEMM i+1 overlaps collective i.
//  - communicate-first (all_gather_matmul[_v2]): post AG of chunk i, then wait AG i−1 and GEMM chunk i−1; a
//    depth-1 software pipeline, AG i overlaps GEMM i−1.
// With N = 1 (or T = 1) the op runs in the plain Megatron order: one GEMM and one blocking collective, no overlap.
//  - point-to-point (CocOptions::comm_algo = kP2p; deterministic mode too, bitwise equal to the collective one):
//    the same results from MPI_Isend/Irecv,
//    ordered by who needs the rows: remote rows first for the reduce-scatter and the all-reduce (which then sends
//    each reduced chunk of its own rows to every peer), own rows first for the all-gather (p2p_schedules.cpp).
//  - automatic (parallel_num = CocOptions::kAuto): the first call of each shape times the candidates and keeps the
//    fastest, or chooses serial without timing on one node and for tiny m (auto_schedule.cpp, CocAutoChoice).
//  - MindSpeed's customized_coc table (CocOptions::customized) sets N per rank-local shape [m, k, n].
// The bias is added once, after the reduction (never T times; edge case 3 of docs/edge-cases.md).
//
// Deterministic mode (`opts.deterministic`): rank-ordered sums and GEMMs in fixed 128-row tiles, so the result is
// bitwise identical from run to run and for every N, schedule and path, at T× the bytes on the wire of a reduction
// (docs/design.md, "Deterministic mode").
//
// CocOptions::min_chunk_rows lowers N until every chunk has that many rows per rank; a call that ends up
// unchunked although N > 1 and T > 1 counts as a serial fallback in CocStats. With log level >= 2 (--verbose),
// rank 0 of the group logs one line per call: op, tag, m/k/n, T, requested and effective N, chunk rows, mode and
// why.
//
// Errors: a uniform kInvalidArgument error naming the op, rank and shapes when shapes do not match, N < 1,
// min_chunk_rows < 1 or `out` aliases an input. With --debug-collectives (CommOptions::check_fingerprints) the
// ranks first agree on the op's shape and options, so ranks that disagree on m (or one rank with bad arguments)
// make every rank throw a uniform error instead of hanging; without it such a mismatch ends in the collectives'
// kTimeout. kTimeout/kComm come from the collectives.
#pragma once

#include <array>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "coc/comm/communicator.h"
#include "coc/core/dtype.h"
#include "coc/core/tensor.h"
#include "coc/kernels/gemm.h"
#include "coc/overlap/partition.h"

namespace coc {

/// Per-rank counters of the CoC ops, for --verbose and benchmarks. Times in seconds.
struct CocStats {
  double gemm_s = 0;        ///< time in GEMM calls inside the ops
  double comm_wait_s = 0;   ///< time blocked in Work::wait inside the ops (exposed communication)
  int64_t calls = 0;        ///< op invocations
  int64_t chunks = 0;       ///< GEMM chunks run
  int64_t serial_fallbacks = 0;  ///< calls that ran unchunked although N > 1 (see CocOptions::min_chunk_rows)
  double gflop = 0;         ///< GEMM work done (1e9 FLOP)
  int64_t fused_calls = 0;      ///< calls that ran the fused node-shared kernel (CocOptions::fused)
  int64_t fused_fallbacks = 0;  ///< calls with CocOptions::fused that ran the chunked pipeline instead (-v says why)
  void reset() { *this = CocStats{}; }
  CocStats& operator+=(const CocStats& o);
};

/// How a chunked op communicates (--coc-comm-algo). kCollective: one MPI collective per chunk (MindSpeed's CoC).
/// kP2p: the ops built from point-to-point messages, remote rows first for the reduce-scatter and the all-reduce
/// (whose reduced rows are then gathered chunk by chunk), own rows first for the all-gather (p2p_schedules.cpp).
/// In deterministic mode both give the same bits.
enum class CocCommAlgo { kCollective, kP2p };

/// "collective" / "p2p"; throws a uniform kInvalidArgument error for anything else.
CocCommAlgo parse_comm_algo(const std::string& s);
const char* to_string(CocCommAlgo a);

namespace detail {
/// Called from a catch block while collectives of an op are in flight: waits for them (their buffers may be
/// freed once the exception unwinds), unless the error means the peers are gone (a timeout, or a non-uniform
/// MPI failure: the job is being aborted and waiting would only add another deadline). Never throws. The CoC ops
/// use it, and so do layers that post Works of their own (RowParallelLinear's segmented backward).
void drain_after_error(std::vector<Work>& works, std::exception_ptr cause);
}  // namespace detail

/// Rows per GEMM call in deterministic mode. OpenBLAS's result for one row depends on how many rows the call
/// has and where the row sits in it (measured with 0.3.21 Haswell kernels: no chunking of m is bitwise equal to
/// the unchunked call), so deterministic mode always computes rows in the same calls: tiles of this many rows at
/// multiples of it in the full matrix, whatever N is. 128 rows keep ~90% of the single-call GEMM rate. Layers that
/// split a GEMM of their own (RowParallelLinear's segmented backward) use the same tiles to keep the ops' bits.
inline constexpr int64_t kDeterministicTileRows = 128;

/// Computes rows [rows.begin, rows.end()) of an op's left matrix `a` in place (CocOptions::produce_rows). Called
/// with ranges that may overlap earlier ones: a producer computes what it has not yet computed and skips the rest.
/// The ops copy their options, and the producer with them: its record of what it computed must live outside the
/// closure (captured by reference), or a copy computes it again.
using RowProducer = std::function<void(RowRange rows)>;

struct CocOptions {
  /// parallel_num value meaning "choose N and the algorithm per shape" (--coc-parallel-num auto, auto_schedule.h).
  static constexpr int kAuto = 0;
  int parallel_num = 4;       ///< N, --coc-parallel-num; N = 1 is the plain Megatron order; kAuto: chosen per shape
  CocCommAlgo comm_algo = CocCommAlgo::kCollective;  ///< --coc-comm-algo (ignored under kAuto, which chooses it)
  bool deterministic = false; ///< fixed reduction order, bitwise identical across runs and N
  /// Element type on the wire (issue 35 item 3): kF32 (default) or kBF16; anything else is a kInvalidArgument
  /// error. Inputs and outputs stay fp32 buffers either way. Under kBF16:
  ///  - the all-gather ops round each rank's block to bf16 once, gather bf16 and widen each chunk to fp32 where
  ///    the GEMM reads it (`gathered` of the _v2 form holds the rounded rows, this rank's too);
  ///  - the reduce ops round each rank's fp32 partial (its GEMM output) to bf16, move bf16, sum in fp32 and round
  ///    the sum once to bf16 (Megatron's bf16 GEMM outputs and sums); the bias is added after, in fp32. In
  ///    deterministic mode the sum is coc's own, in rank order, so out = bf16(((p_0 + p_1) + ...) + p_{T-1}) with
  ///    p_r = bf16(rank r's partial), bitwise the same for every N, algorithm and engine. Without it the collective
  ///    schedules use MPI's 16-bit sum (comm/communicator.h: up to T - 1 roundings).
  /// Where bf16 actually travels: the collective all-gather, all-reduce and reduce-scatter schedules and the
  /// deterministic all-reduce. The deterministic collective reduce-scatter and the point-to-point schedules move
  /// the same bf16-rounded values in fp32 elements (the same bits, full bytes; their transports are fp32-only). The
  /// fused kernel and MC2 fall back to the chunked pipeline (CocStats::fused_fallbacks; -v says why). With T = 1
  /// nothing is communicated and nothing is rounded. w8a16_matmul_all_reduce ignores it (always fp32).
  DType comm_dtype = DType::kF32;
  /// Smallest chunk (rows per rank) worth overlapping: below it a chunk's GEMM is too short to hide anything and
  /// the per-chunk overhead makes the op slower than serial (edge case 11). N is lowered until chunks reach this
  /// size, and verbose mode says so. 1 disables the fallback.
  int64_t min_chunk_rows = 1;
  /// Run the fused node-local shared-memory implementation (fused_ops.h, --coc-fused-kernel / --use-mc2) when
  /// every rank of the group shares one node and the window can be made; otherwise the chunked pipeline runs, the call
  /// counts in CocStats::fused_fallbacks and verbose mode says why.
  bool fused = false;
  /// The caller has independent work for the returned CocPending to hide (the column layer's weight-gradient GEMM,
  /// --tp-comm-bulk-wgrad): the unchunked (N = 1) all-reduce and reduce-scatter are posted non-blocking instead of
  /// running the blocking MPI call, so that they are in flight until wait(). Same bits either way in deterministic
  /// mode and at T = 2; at T >= 3 otherwise the non-blocking collective (MPI's, or the point-to-point one) may sum
  /// in another order than the blocking call.
  bool nonblocking_serial = false;
  /// Independent work for the all-gather-first ops (all_gather_matmul[_v2]) to run while their gather is in
  /// flight, under progress_during (comm/progress.h): used with nonblocking_serial and N = 1, where the op posts
  /// the whole gather non-blocking, runs this, then waits and multiplies. Other schedules do not call it (the
  /// caller runs whatever it left; RowParallelLinear's queue makes that a no-op). Same bits either way.
  std::function<void()> during_gather;
  /// The compute-first ops only (matmul_reduce_scatter, matmul_all_reduce, w8a16_matmul_all_reduce): `a` is not
  /// computed yet, and the op
  /// calls this with the rows each GEMM is about to read (in deterministic mode, the whole 128-row tiles), just
  /// before it reads them. So whatever produces `a` joins the pipeline: its rows for chunk i+1 are computed while
  /// chunk i's collective is in flight (the decoder's attention feeding the output projection,
  /// --attention-dense-pipeline; coc's own). The fused kernel, auto's timing trials, T = 1 and the all-gather ops
  /// produce every row first. Every row of `a` is requested before the op returns. Same bits as a computed `a`
  /// as long as the producer's own bits do not depend on the ranges it is given.
  RowProducer produce_rows;
  /// The compute-first ops take their chunks from the last rows to the first (ChunkPlan's last_rows_first), for a
  /// produce_rows that finishes rows from the end: attention's backward, last query block first
  /// (--attention-qkv-backward-pipeline, coc's own). Their point-to-point schedule visits rows in its own order, so
  /// the collective one runs instead. Same bits either way in deterministic mode (fixed tiles, rank-ordered sums).
  bool last_rows_first = false;
  /// The all-gather ops only (all_gather_matmul[_v2]): called with rows of `out` once they are final (GEMM and bias
  /// done), each row once, before the op returns; the collective schedule calls it chunk by chunk, under the next
  /// chunk's gather, every other path (fused, point-to-point, T = 1) once for all rows at the end. For a row-wise
  /// epilogue of the caller's, such as rounding the output to what a bf16 model stores (TransformerLayer's qkv and
  /// gate_up outputs): it then runs while a link-bound gather is in flight, on rows still in cache, instead of as a
  /// pass of its own after the op. Auto's timing trials do not call it.
  std::function<void(RowRange rows)> finish_rows;
  CocStats* stats = nullptr;  ///< if set, counters are added here
  std::string tag;            ///< label for logs and errors ("layers.0.mlp.down fwd")
  /// MindSpeed's per-shape override (customized_coc in lcal_coc/user_config.py, --customized-coc): the N to use
  /// when this rank's GEMM is exactly [m, k] · [k, n]; takes precedence over parallel_num (and may be kAuto).
  /// Null: none. Shared, because CocOptions is copied per call.
  std::shared_ptr<const std::map<std::array<int64_t, 3>, int>> customized;
};

/// An op whose last collectives may still be in flight: wait() completes them (and adds the bias). Lets a layer
/// overlap the tail of a collective with independent work (e.g. the column layer's dX reduce with its dW GEMM).
/// Must be waited before the output is read and before the inputs are freed.
/// Errors: wait() rethrows the collectives' kTimeout/kComm errors (the object is then empty). The destructor
/// waits if the caller forgot; since a destructor must not throw, a failure there is logged and the job is
/// ended with MPI_Abort (never std::terminate, which would leave the peers hanging).
class CocPending {
 public:
  CocPending() = default;
  /// works: the op's posted collectives, waited in order; finish: runs once after the last one (bias, copies
  /// out of scratch); stats: if set, receives the time blocked in wait() as comm_wait_s.
  CocPending(std::vector<Work> works, std::function<void()> finish, CocStats* stats)
      : works_(std::move(works)), finish_(std::move(finish)), stats_(stats) {}
  CocPending(CocPending&& o) noexcept;
  /// Waits for this object's own op first (its buffers would otherwise be forgotten while in flight).
  CocPending& operator=(CocPending&& o);
  ~CocPending();  // waits if the caller forgot, so buffers are never freed under MPI
  void wait();
  /// True until wait() ran (false for a default-constructed or moved-from object).
  bool pending() const { return !works_.empty() || static_cast<bool>(finish_); }

 private:
  std::vector<Work> works_;
  std::function<void()> finish_;
  CocStats* stats_ = nullptr;
};

/// One automatic choice of --coc-parallel-num auto (auto_schedule.cpp), made the first time an op meets a shape
/// on a communicator, identical on every rank of it.
struct CocAutoChoice {
  std::string op;                 ///< "matmul_reduce_scatter", ...
  std::string comm;               ///< communicator name ("tp")
  int64_t m = 0;                  ///< rows (tokens) of the full matrix
  int64_t dim = 0;                ///< the other agreed dimension: n (reduce ops) or k (all-gather)
  int64_t local_dim = 0;          ///< the per-rank dimension (k of the reduce ops, n of the all-gather), max over ranks
  int parallel_num = 1;           ///< chosen N; 1 = serial (blocking collective)
  CocCommAlgo algo = CocCommAlgo::kCollective;
  bool fused = false;             ///< the fused node-shared kernel runs (--coc-fused-kernel on one node): N unused
  bool from_cache = false;        ///< taken from --coc-tuning-cache without timing (candidates_ms: the earlier run's)
  std::string reason;             ///< why, in one sentence
  /// Timed candidates: label, median over its rounds of the max-over-ranks time (ms).
  std::vector<std::pair<std::string, double>> candidates_ms;
};
/// Parses a customized_coc table: a JSON object whose keys are "[m, k, n]" (the per-rank GEMM shape, as MindSpeed's
/// str([m, k, n])) and whose values are N >= 1 or "auto", e.g. {"[4096, 1024, 1024]": 8, "[4096, 1024, 512]": 1}.
/// `text` is the object itself or "@FILE" naming a file that holds it. Throws a uniform kInvalidArgument error naming
/// the offending key or value.
std::shared_ptr<const std::map<std::array<int64_t, 3>, int>> parse_customized_coc(const std::string& text);

/// Every automatic choice this process made so far, oldest first (for `coc bench overlap` and --verbose).
std::vector<CocAutoChoice> coc_auto_choices();
/// Forgets the choices (the next call of each shape times its candidates again). Not thread-safe against ops in
/// flight on other threads.
void coc_auto_forget();

/// out[m, n] = AR_T(a[m, k] · W) + bias. Compute-first. Same m and n on every rank; k (this rank's slice of the
/// input features) may differ. All fp32; views may be strided (ld >= cols), `out` must not overlap a or w.
/// bias: n floats or nullptr. The row-parallel forward without SP (MindSpeed
/// lcal_coc/coc_parallel_linears_all_reduce.py, CoCRowParallelLinearWithAllReduce; Megatron RowParallelLinear).
/// Returns with the all-reduces possibly in flight: wait() before reading `out` or freeing any input.
CocPending matmul_all_reduce_async(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                                   MatrixView out, const float* bias, const CocOptions& opts);
/// out[m_r, n] = rows split_rows(m, T, r) of RS_T(a[m, k] · W), + bias. Compute-first. Same m and n on every rank;
/// m need not be a multiple of T or N (uneven shares). fp32, strided views allowed, bias n floats or nullptr.
/// The row-parallel forward with SP (MindSpeed coc_parallel_linears_sequence_parallel.py,
/// CoCRowParallelLinearWithReduceScatter; Megatron RowParallelLinear with sequence_parallel).
CocPending matmul_reduce_scatter_async(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                                       MatrixView out, const float* bias, const CocOptions& opts);
/// out[m, n] = AG_T(a[m_r, k]) · W + bias, where m = out.rows and a has split_rows(m, T, r) rows.
/// Communicate-first. `gathered` ([m, k], may be null) receives AG(a) (the _v2 variant); a may be a view of this
/// rank's own rows of `gathered`. Same m and k on every rank; n may differ. fp32, strided views allowed.
/// The column-parallel forward with SP (MindSpeed CoCColumnSeqParallelFunction; Megatron ColumnParallelLinear
/// with sequence_parallel). Every gather is waited inside, so the returned CocPending has nothing in flight.
CocPending all_gather_matmul_async(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                                   MatrixView out, const float* bias, MatrixView* gathered, const CocOptions& opts);

/// Blocking forms of the above (docs/semantics.md §3 names).
void matmul_all_reduce(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout, MatrixView out,
                       const float* bias, const CocOptions& opts);
void matmul_reduce_scatter(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                           MatrixView out, const float* bias, const CocOptions& opts);
void all_gather_matmul(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout, MatrixView out,
                       const float* bias, const CocOptions& opts);
void all_gather_matmul_v2(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                          MatrixView out, MatrixView gathered, const float* bias, const CocOptions& opts);
/// The same under --bf16, keeping AG(a) in bf16: `gathered` [m, k] (any ld >= k) receives the gathered rows
/// rounded to bf16, the values the bf16 GEMMs read. With a bf16 wire and a dense `gathered` the rows are gathered
/// straight into it, and no fp32 copy of the [m, k] input exists (half the bytes a layer keeps for its weight
/// gradient; the memory line's gathered window). Throws kInvalidArgument unless gemm_compute_type() is kBF16.
void all_gather_matmul_v2(Communicator& group, ConstMatrixView a, ConstMatrixView w, WeightLayout layout,
                          MatrixView out, Bf16View gathered, const float* bias, const CocOptions& opts);

/// Collective-only building blocks with the same row conventions and deterministic option (used by layers for
/// un-chunked communication, e.g. the embedding; Megatron mappings.py): in-place AR of x[m, c]; RS of x[m, c] to
/// out[m_r, c]; AG of x[m_r, c] to out[m, c]. fp32, strided views allowed (copied through dense scratch). The
/// returned Work must be waited before the buffers are read or freed; its completion step does the rank-ordered
/// sum (deterministic) or the copy back into a strided output. Errors: a uniform kInvalidArgument naming the op,
/// rank and shapes on a shape mismatch (thrown before anything is posted).
/// `wire` = kBF16 moves 2-byte elements (--grad-reduce-in-bf16, FSDP's gathers under --bf16): what is sent is
/// rounded to bf16 and what arrives widened, so the gather delivers bf16 values; the reductions sum in fp32 and
/// round (deterministic: the widened partials in rank order, rounded once; otherwise MPI's sum by coc's 16-bit
/// MPI_Op, element_types.h). On one rank nothing moves and nothing is rounded.
Work all_reduce_rows(Communicator& group, MatrixView x, bool deterministic, const std::string& tag,
                     DType wire = DType::kF32);
Work reduce_scatter_rows(Communicator& group, ConstMatrixView x, MatrixView out, bool deterministic,
                         const std::string& tag, DType wire = DType::kF32);
Work all_gather_rows(Communicator& group, ConstMatrixView x, MatrixView out, const std::string& tag,
                     DType wire = DType::kF32);

}  // namespace coc
