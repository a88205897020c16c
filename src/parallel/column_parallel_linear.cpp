#include <algorithm>
#include <numeric>

#include "coc/comm/progress.h"
#include "coc/core/error.h"
#include "coc/overlap/partition.h"
#include "coc/parallel/linear.h"

namespace coc {

namespace {
void require(bool ok, const std::string& what) {
  if (!ok) throw_invalid("{}", what);
}
}  // namespace

ColumnParallelLinear::ColumnParallelLinear(std::string name, int64_t in_features, int64_t out_features,
                                           const ParallelContext* ctx, Options options)
    : name_(std::move(name)), k_(in_features), n_(out_features), ctx_(ctx) {
  require(k_ >= 1 && n_ >= 1, fmt::format("{}: in/out features must be >= 1 (got {} → {})", name_, k_, n_));
  RowRange r = split_rows(n_, ctx_->tp_size(), ctx_->tp_rank());
  std::vector<int64_t> rows(static_cast<size_t>(r.count));
  std::iota(rows.begin(), rows.end(), r.begin);
  weight.name = name_ + ".weight";
  weight.read_as_compute_type = true;  // only GEMMs read it: matmul, the CoC ops, GatheredVocabHead (param.h)
  if (options.bias) {
    this->bias.name = name_ + ".bias";
    this->bias.weight_decay = false;
  }
  set_row_map(std::move(rows));
}

void ColumnParallelLinear::set_context(const ParallelContext* ctx) {
  COC_ASSERT(ctx->tp == ctx_->tp, "{}: a context on another TP group", name_);
  ctx_ = ctx;
}

void ColumnParallelLinear::set_row_map(std::vector<int64_t> full_rows) {
  for (int64_t r : full_rows) COC_ASSERT(r >= 0 && r < n_, "{} row {} of {}", name_, r, n_);
  row_map_ = std::move(full_rows);
  const auto nr = static_cast<int64_t>(row_map_.size());
  weight.value.resize({nr, k_});
  weight.grad.resize({nr, k_});
  if (!bias.name.empty()) {
    bias.value.resize({nr});
    bias.grad.resize({nr});
  }
}

ParamList ColumnParallelLinear::params() {
  ParamList p{&weight};
  if (!bias.name.empty()) p.push_back(&bias);
  return p;
}

void ColumnParallelLinear::forward(ConstMatrixView x, int64_t m, MatrixView y,
                                   const std::function<void(RowRange)>& finish) {
  const bool sp = ctx_->sequence_parallel;
  const int64_t rows_in = sp ? ctx_->shard_rows(m) : m;
  if (x.rows != rows_in || x.cols != k_ || y.rows != m || y.cols != local_out())
    throw_invalid("{} forward (rank {}): input {}x{} / output {}x{} do not match m={}, k={}, n_local={}{}", name_,
                  ctx_->tp_rank(), x.rows, x.cols, y.rows, y.cols, m, k_, local_out(),
                  sp ? " (sequence parallel: input rows must be this rank's shard)" : "");
  m_ = m;
  const float* b = bias.name.empty() ? nullptr : bias.value.data();
  CocOptions o = ctx_->coc;
  o.tag = name_ + " fwd";
  o.fused = ctx_->fused_kernel || ctx_->mc2;
  o.finish_rows = finish;
  if (!sp) {
    saved_x_ = x;
    matmul(x, weight.value.mat(), WeightLayout::kNK, y);
    if (b) add_bias(y, b);
    if (finish && m > 0) finish({0, m});
    return;
  }
  // SP: AG→GEMM, communicate-first; the gathered X is kept for the weight gradient (MindSpeed recomputes it in
  // backward to save memory; we keep it: one [m, k] buffer per layer, in bf16 under --bf16, and one all-gather
  // fewer per step).
  reserve(m);
  kept16_ = gemm_compute_type() == DType::kBF16;
  if (kept16_)
    all_gather_matmul_v2(*ctx_->tp, x, weight.value.mat(), WeightLayout::kNK, y, x_full16().mat(), b, o);
  else
    all_gather_matmul_v2(*ctx_->tp, x, weight.value.mat(), WeightLayout::kNK, y, x_full().mat(), b, o);
}

void ColumnParallelLinear::reserve(int64_t m_total) {
  if (!ctx_->sequence_parallel) return;
  if (gemm_compute_type() == DType::kBF16)
    x_full16().resize(m_total, k_);
  else
    x_full().resize({m_total, k_});
}

void ColumnParallelLinear::backward(ConstMatrixView dy, MatrixView dx, const ColumnWgrad& wgrad,
                                    const RowProducer& produce, int64_t chunk_rows) {
  const bool sp = ctx_->sequence_parallel;
  const int64_t m = m_;
  if (dy.rows != m || dy.cols != local_out() || dx.cols != k_ || dx.rows != (sp ? ctx_->shard_rows(m) : m))
    throw_invalid("{} backward (rank {}): dy {}x{} / dx {}x{} do not match forward m={}, k={}, n_local={}", name_,
                  ctx_->tp_rank(), dy.rows, dy.cols, dx.rows, dx.cols, m, k_, local_out());
  if (produce && chunk_rows < 1)
    throw_invalid("{} backward (rank {}): chunk_rows must be >= 1 with a row producer, got {}", name_,
                  ctx_->tp_rank(), chunk_rows);
  CocOptions o = ctx_->coc;
  o.tag = name_ + " bwd dX";
  // MC2 keeps the chunked overlap here (the RS tail hides the dW GEMM) unless there is no dW to hide.
  o.fused = ctx_->fused_kernel || (ctx_->mc2 && !weight.requires_grad);
  const bool auto_n = o.parallel_num == CocOptions::kAuto && !o.customized;
  const bool bulk = ctx_->tp_comm_bulk_wgrad;
  if (bulk) {
    // TransformerEngine's bulk overlap: the dW GEMM hides the whole reduction, so auto has nothing to time and
    // N = 1 posts it non-blocking (an explicit N > 1 or a customized table keeps its chunks).
    o.nonblocking_serial = true;
    if (auto_n) o.parallel_num = 1;
  }
  if (produce) {
    o.produce_rows = produce;
    o.last_rows_first = true;
    o.comm_algo = CocCommAlgo::kCollective;  // the point-to-point schedule visits rows in its own order
    // The producer's work, not the GEMM, is what the chunks hide: one chunk per chunk_rows of the largest share
    // (split_rows gives rank 0 the most rows).
    const int64_t share = sp ? split_rows(m, ctx_->tp_size(), 0).count : m;
    if (auto_n)
      o.parallel_num = static_cast<int>(std::clamp<int64_t>((share + chunk_rows - 1) / chunk_rows, 1, 64));
  }
  const bool x16 = sp && kept16_;
  ConstMatrixView x = sp && !x16 ? ConstMatrixView(x_full().mat()) : saved_x_;
  // Under --bf16 the dX GEMMs (every CoC chunk) and dW read one bf16 copy of dY, each row rounded once, at its first
  // read (with a producer, after it has produced the row), unless a copy the caller holds serves dY already.
  const GemmOperandCopy dy16(dy);
  // dX = dY·W_l: W_l [n_r, k] read as [K=n_r, N=k]. Its reduction (AR, or RS with SP) is still in flight when the
  // op returns, and the weight-gradient work below (this layer's, and the row layers' queued by
  // --delay-wgrad-compute) runs meanwhile.
  CocPending pending = sp ? matmul_reduce_scatter_async(*ctx_->tp, dy, weight.value.mat(), WeightLayout::kKN, dx,
                                                        nullptr, o)
                          : matmul_all_reduce_async(*ctx_->tp, dy, weight.value.mat(), WeightLayout::kKN, dx,
                                                    nullptr, o);
  WgradQueue* queue = wgrad.queue;
  if (queue && ctx_->delay_wgrad_compute && wgrad.defer_own && ctx_->tp_size() == 1) {
    pending.wait();  // tp = 1: nothing in flight
    queue->run();
    const bool dw = weight.requires_grad, db = !bias.name.empty() && bias.requires_grad;
    if (dw || db)
      queue->push([this, dy, x, dw, db] {
        if (dw) gemm(dy, /*trans_a=*/true, x, false, weight.grad.mat(), 1.0f, 1.0f);
        if (db) accumulate_colsum(dy, bias.grad.data());
      });
    return;
  }
  // --delay-column-wgrad: this layer's own dW hides its reduction, and the queued row-layer work waits for the
  // next row layer's all-gather (context.h).
  const bool leave_queue = wgrad.leave_for_row_gather && ctx_->wgrad_under_row_gather();
  const auto own_wgrad = [&] {
    if (queue && !leave_queue) queue->run();
    if (weight.requires_grad && x16)
      gemm(dy, /*trans_a=*/true, ConstBf16View(x_full16().mat()), false, weight.grad.mat(), 1.0f, 1.0f);
    else if (weight.requires_grad)
      gemm(dy, /*trans_a=*/true, x, false, weight.grad.mat(), 1.0f, 1.0f);
    if (!bias.name.empty() && bias.requires_grad) accumulate_colsum(dy, bias.grad.data());
  };
  if (bulk)
    progress_during(*ctx_->tp, own_wgrad);
  else
    own_wgrad();
  pending.wait();
}

}  // namespace coc
