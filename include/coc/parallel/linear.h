// Megatron's ColumnParallelLinear and RowParallelLinear (megatron/core/tensor_parallel/layers.py), with
// MindSpeed's CoC overlap (mindspeed/core/tensor_parallel/lcal_coc/coc_parallel_linears_*.py) applied to exactly
// the pairs of docs/semantics.md §2 (its table says which CoC op runs in which pass, with and without SP).
//
// Shapes (m = tokens of the micro-batch, full; m_r = split_rows(m, T, r) = this rank's sequence shard):
//  - Column(k → n): W_local [n_r, k] (Megatron layout [out, in]), n_r = split_rows(n, T, r) (uneven allowed);
//    bias [n_r]. Input X: [m, k] (SP off) or [m_r, k] (SP on). Output Y: [m, n_r].
//  - Row(k → n): W_local [n, k_r], k_r = split_rows(k, T, r); bias [n], replicated. Input X: [m, k_r] (or [m, k]
//    with input_is_parallel = false, scattered first); output Y: [m, n] (SP off) or [m_r, n] (SP on).
// Construction: the name, the full feature sizes, the const ParallelContext (whose `tp` is the group the layer's ops
// run on, injected by the caller as Megatron-core passes tp_group, with sequence parallelism and the CoC options) and
// the layer's named options, Megatron's keyword arguments: ColumnParallelLinear("fc1", k, n, &ctx, {.bias = true}),
// RowParallelLinear("fc2", k, n, &ctx, {.bias = true, .input_is_parallel = false}).
// Gradients accumulate (+=) into Param::grad, so micro-batches accumulate into the fp32 master gradient.
// Backward overlap (ParallelContext::tp_comm_bulk_wgrad, delay_wgrad_compute; docs/semantics.md §2): the column
// layer's dX reduction stays in flight while its dW GEMM runs, and with delay_wgrad_compute the row layer's dW/db
// work is queued on the WgradQueue its backward is given and run there too, so the row layer's dY and X must stay
// unchanged until the next column backward given that queue, or WgradQueue::run(). Neither changes a bit of any
// result.
// The layer keeps what backward needs between forward and backward (X, or the gathered X_full); the caller must
// keep X alive until backward when SP is off. Errors: uniform kInvalidArgument naming the layer and shapes.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "coc/comm/work.h"
#include "coc/parallel/context.h"
#include "coc/parallel/param.h"

namespace coc {

/// ColumnParallelLinear's options (declared outside the class so that `= {}` can default them).
struct ColumnParallelLinearOptions {
  bool bias = false;  ///< a bias [n_r] (Megatron's bias=)
};

/// RowParallelLinear's options.
struct RowParallelLinearOptions {
  bool bias = false;  ///< a bias [n], replicated on every rank of the group (Megatron's bias=)
  /// The input is already split along k (Megatron's input_is_parallel=); false: every rank passes the full [m, k]
  /// input, keeps its k-slice, and backward gathers the full dX.
  bool input_is_parallel = true;
};

class ColumnParallelLinear {
 public:
  using Options = ColumnParallelLinearOptions;
  /// in_features k, out_features n (full sizes). `ctx` must outlive the layer.
  ColumnParallelLinear(std::string name, int64_t in_features, int64_t out_features, const ParallelContext* ctx,
                       Options options = {});
  /// Reads `ctx` from the next call on (`coc bench train --baseline`'s other side, sampling without SP). It must
  /// name the same TP group; kInternal otherwise.
  void set_context(const ParallelContext* ctx);
  /// x: [m, k] or [m_r, k] (SP); m_total = m. y: [m, n_r].
  /// `finish` (may be empty): a row-wise epilogue called with rows of y once they are final, each row once (with SP
  /// as each chunk's GEMM is done, under the next chunk's gather: CocOptions::finish_rows; otherwise at the end).
  void forward(ConstMatrixView x, int64_t m_total, MatrixView y, const std::function<void(RowRange)>& finish = {});
  /// SP on: allocates the [m_total, k] buffer forward() gathers X into and keeps for backward (Decoder::
  /// reserve_activations says why); nothing otherwise. Not collective.
  /// Where forward keeps the gathered input X_full [m, k] under SP for backward: `store` (which must outlive its
  /// use; layers that recompute their forward share one, model/transformer_layer.h), or the layer's own buffer for
  /// nullptr; under --bf16 (gemm_compute_type() kBF16) `store16` or the layer's own bf16 buffer instead: the weight
  /// gradient's GEMM reads X in bf16 anyway, so half the bytes hold the same bits. Not collective.
  void keep_input_in(Tensor* store, Bf16Matrix* store16 = nullptr) {
    input_store_ = store;
    input_store16_ = store16;
  }
  /// SP off: the input X [m, k] backward reads from now on, the view forward was given for the micro-batch whose
  /// backward comes next (a pipeline stage keeps several micro-batches' activations and runs their backwards after
  /// later forwards; model/pipeline_schedule.h). Under SP backward reads the gathered input in keep_input_in's
  /// store instead, so this changes nothing there. Not collective.
  void set_backward_input(ConstMatrixView x) { saved_x_ = x; }
  void reserve(int64_t m_total);
  /// dy: [m, n_r] → dx: [m, k] or [m_r, k] (SP), overwritten. Also runs the work on `wgrad.queue` while the dX
  /// reduction is in flight (unless ColumnWgrad says to leave it).
  /// `produce` (may be empty): dy's rows are computed on demand, from the last rows down, just before the dX GEMM
  /// chunk that reads them (CocOptions::produce_rows and last_rows_first), so the reduction of the last chunks
  /// flies while the producer computes the earlier rows (TransformerLayer's attention backward:
  /// --attention-qkv-backward-pipeline). Under --coc-parallel-num auto the op then takes one chunk per
  /// `chunk_rows` rows of the largest share (>= 1 with a producer; auto's timing, which cannot see the producer's
  /// work, is skipped); an explicit N or customized table keeps its own. Every row of dy has been produced when
  /// backward returns. Throws kInvalidArgument for shapes that do not match forward, or chunk_rows < 1 with a
  /// producer.
  void backward(ConstMatrixView dy, MatrixView dx, const ColumnWgrad& wgrad = {}, const RowProducer& produce = {},
                int64_t chunk_rows = 0);
  /// Rows of the full [n, k] weight held here, in order (default: split_rows(n, T, r)). Fused layers (QKV, gate/up)
  /// override it so each rank gets whole heads of every part.
  void set_row_map(std::vector<int64_t> full_rows);
  const std::vector<int64_t>& row_map() const { return row_map_; }
  int64_t in_features() const { return k_; }
  /// Rows of the weight held here, from the row map: the weight tensor itself is empty while sharded data
  /// parallelism has freed it (parallel/fsdp.h).
  int64_t local_out() const { return static_cast<int64_t>(row_map_.size()); }
  ParamList params();

  Param weight;  ///< read only by GEMMs (Param::read_as_compute_type)
  Param bias;    ///< empty tensor when the layer has no bias; added in fp32

 private:
  std::string name_;
  int64_t k_, n_;
  const ParallelContext* ctx_;
  std::vector<int64_t> row_map_;
  ConstMatrixView saved_x_;  ///< SP off: the caller's X
  Tensor x_full_;                 ///< SP on: the gathered X, unless keep_input_in named another store
  Tensor* input_store_ = nullptr;  ///< keep_input_in
  Bf16Matrix x_full16_;              ///< SP on under --bf16: the gathered X in bf16, unless keep_input_in named one
  Bf16Matrix* input_store16_ = nullptr;
  bool kept16_ = false;  ///< the last forward kept its gathered X in bf16
  Tensor& x_full() { return input_store_ ? *input_store_ : x_full_; }
  Bf16Matrix& x_full16() { return input_store16_ ? *input_store16_ : x_full16_; }
  int64_t m_ = 0;
};

/// Receives rows [rows.begin, rows.end()) of a layer's output as they become final (RowParallelLinear::backward).
using RowConsumer = std::function<void(RowRange rows)>;

class RowParallelLinear {
 public:
  using Options = RowParallelLinearOptions;
  /// in_features k, out_features n (full sizes). `ctx` must outlive the layer.
  RowParallelLinear(std::string name, int64_t in_features, int64_t out_features, const ParallelContext* ctx,
                    Options options = {});
  /// Waits for backward's sends still in flight (they read dY's buffers), without throwing.
  ~RowParallelLinear();
  RowParallelLinear(RowParallelLinear&&) = default;  // the moved-from layer keeps no sends
  RowParallelLinear& operator=(RowParallelLinear&&) = delete;  // would free buffers that sends in flight read
  /// As ColumnParallelLinear::set_context.
  void set_context(const ParallelContext* ctx);
  /// x: [m, k_r] (or [m, k] when !input_is_parallel). y: [m, n] (SP off) or [m_r, n] (SP on).
  /// `produce` (may be empty): x's rows are computed on demand, just before the GEMM chunk that reads them
  /// (CocOptions::produce_rows); every row has been produced when forward returns.
  void forward(ConstMatrixView x, int64_t m_total, MatrixView y, const RowProducer& produce = {});
  /// As forward, but returns once every GEMM has run, with the chunks' reduction (reduce-scatter under SP,
  /// all-reduce without) possibly in flight: y is final, and x and the weight may change, only after the result's
  /// wait(). For a caller with independent work to run meanwhile (another micro-batch's,
  /// TransformerLayer::forward_pair). N = 1 runs its blocking collective, as forward does: MPI's non-blocking one may
  /// sum in another order at T >= 3, and the bits must be forward's.
  CocPending forward_async(ConstMatrixView x, int64_t m_total, MatrixView y, const RowProducer& produce = {});
  /// Allocates the buffers forward() and backward() keep for m_total rows: SP on, the [m_total, n] gathered dY;
  /// input not parallel, this rank's [m_total, k_r] columns of X and dX (Decoder::reserve_activations says why).
  /// Not collective.
  void reserve(int64_t m_total);
  /// input_is_parallel only: the input X [m, k_r] backward reads from now on (ColumnParallelLinear::
  /// set_backward_input says why). kInternal for a layer whose input is not parallel (it keeps its own copy).
  void set_backward_input(ConstMatrixView x);
  /// dy: [m, n] or [m_r, n] (SP) → dx: [m, k_r] (or [m, k] when !input_is_parallel), overwritten. With
  /// ctx.delay_wgrad_compute and a `queue` the weight and bias gradients are queued there and added when it runs
  /// (the next ColumnParallelLinear::backward given it runs it); dy must stay unchanged until then. Work already on
  /// the queue may run under dY's all-gather (ParallelContext::delay_column_wgrad).
  ///
  /// `consume` (may be empty) is called with rows of dx as they become final, each row once; every row has been
  /// handed out when backward returns. With SP over tp > 1 (input_is_parallel, no fused kernel or MC2) dY's
  /// all-gather then goes in segments: each rank's shard cut on the multiples of `segment_rows` (>= 1, rows of the
  /// full m), one point-to-point exchange per segment index, each rank's last rows first, and dx's rows are
  /// computed and handed out as their segment arrives, so the caller computes on them while the rest is in flight
  /// (TransformerLayer's attention backward, last query block first: --attention-dense-backward-pipeline). In
  /// deterministic mode dx keeps the bits of the unsegmented path (the GEMMs run in its 128-row tiles,
  /// kDeterministicTileRows); otherwise the row split may round differently. Elsewhere dx is computed whole and
  /// handed out at the end.
  ///
  /// `wgrad_as_rows_arrive` (a segmented gather across nodes outside deterministic mode; ignored elsewhere): the
  /// weight gradient is summed as dY's rows arrive, this rank's rows in one GEMM after their dX and each peer
  /// segment's after its dX, into the waits for the later segments, instead of in one GEMM afterwards or on the
  /// queue. The down projection's gather at 1 Gbit/s outlasts its dX GEMMs (docs/performance.md point 52). The row
  /// blocks sum in another order, so the gradient may round differently (deterministic mode keeps the one GEMM).
  /// Collective over the TP group (the node check, Communicator::shm_window, the first time).
  /// Throws kInvalidArgument for shapes that do not match forward, or segment_rows < 1 with a consumer.
  void backward(ConstMatrixView dy, MatrixView dx, WgradQueue* queue = nullptr, const RowConsumer& consume = {},
                int64_t segment_rows = 0, bool wgrad_as_rows_arrive = false);
  /// Columns [begin, begin+count) of the full k held here.
  int64_t in_begin() const { return in_begin_; }
  /// Columns of the full k held here (from the split, like local_out: not from the weight tensor).
  int64_t local_in() const { return in_count_; }
  ParamList params();

  Param weight;  ///< read only by GEMMs (Param::read_as_compute_type)
  Param bias;    ///< added in fp32 before the output is rounded

 private:
  /// forward's checks and input: x itself, or this rank's columns of it when the input is not parallel (copied
  /// after producing every row); records what backward reads.
  ConstMatrixView forward_input(ConstMatrixView x, int64_t m_total, MatrixView y, const RowProducer& produce);
  std::string name_;
  int64_t k_, n_;
  bool input_is_parallel_;
  int64_t in_begin_ = 0, in_count_ = 0;
  const ParallelContext* ctx_;
  Tensor x_local_;  ///< scattered input (input_is_parallel = false) or a copy for backward
  ConstMatrixView saved_x_;
  /// backward's segmented all-gather of dY and the dX GEMMs as its segments arrive (see backward).
  /// `dw_by_rows`: sums the weight gradient as the rows arrive (backward decides: wgrad_as_rows_arrive).
  void gather_in_segments(ConstMatrixView dy, MatrixView dx, WgradQueue* queue, const RowConsumer& consume,
                          int64_t segment_rows, bool dw_by_rows);
  bool logged_segments_ = false;  ///< gather_in_segments has named its path (-v) once
  /// The segmented gather's sends still in flight when backward returned. A send completes only once the peer's MPI
  /// progress takes it, and the peer may then be computing (attention's backward): waiting for them at the end of
  /// backward left this rank idle (docs/performance.md point 53). They read this rank's rows of dy_full_ or
  /// dy_full16_, so finish_sends() waits for them before anything writes or frees those: reserve and the destructor.
  std::vector<Work> pending_sends_;
  void finish_sends();
  Tensor dy_full_;      ///< SP backward: gathered dY
  Bf16Matrix dy_full16_;  ///< the same under --bf16 (dy16): the values its GEMMs read, in half the bytes
  /// This backward keeps the gathered dY in bf16: SP with bf16 GEMMs and a bf16 wire, and no bias (whose colsum
  /// reads dY in fp32).
  bool dy16() const;
  Tensor dx_local_;
  int64_t m_ = 0;
};

}  // namespace coc
