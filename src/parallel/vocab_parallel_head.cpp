// GatheredVocabHead: the output layer under VocabComm::kWeights (context.h, vocab_parallel.h). Terms: V vocabulary,
// H hidden size, T the TP group, m the micro-batch's tokens, m_r = split_rows(m, T, r) this rank's
// sequence-parallel rows, V_r = split_rows(V, T, r) its vocabulary rows of the weight.
// Steps:
//   forward:  W [V, H] = all-gather of the shards [V_r, H];  logits [m_r, V] = X_r · Wᵀ
//   backward: dX_r [m_r, H] = dlogits · W (this rank's rows only: nothing to reduce)
//             dW_partial [V, H] = dlogitsᵀ · X_r;  weight.grad [V_r, H] += reduce-scatter over T of dW_partial
// Megatron's output layer instead gathers X [m, H] and reduce-scatters dX [m, H]; both paths compute the same
// logits and the same gradient sums, in different orders.
#include "coc/core/error.h"
#include "coc/kernels/gemm.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/overlap/coc_ops.h"
#include "coc/overlap/partition.h"
#include "coc/parallel/vocab_parallel.h"

namespace coc {

void GatheredVocabHead::forward(const Param& weight, ConstMatrixView x, MatrixView logits) {
  const int64_t vocab = logits.cols, hidden = x.cols;
  const RowRange shard = split_rows(vocab, ctx_->tp_size(), ctx_->tp_rank());
  if (weight.value.dim(0) != shard.count || weight.value.dim(1) != hidden || logits.rows != x.rows)
    throw_invalid("{} forward with gathered weights (rank {}): weight shard {}x{}, x {}x{}, logits {}x{}; expected "
                  "a [{}, {}] shard and logits [{}, {}]",
                  name_, ctx_->tp_rank(), weight.value.dim(0), weight.value.dim(1), x.rows, x.cols, logits.rows,
                  logits.cols, shard.count, hidden, x.rows, vocab);
  full_.resize({vocab, hidden});
  all_gather_rows(*ctx_->tp, weight.value.mat(), full_.mat(), name_ + " fwd weight").wait();
  matmul(x, full_.mat(), WeightLayout::kNK, logits);
}

void GatheredVocabHead::backward(Param& weight, ConstMatrixView dlogits, ConstMatrixView x, MatrixView dx) {
  const int64_t vocab = dlogits.cols, hidden = x.cols;
  if (full_.dim(0) != vocab || full_.dim(1) != hidden || dlogits.rows != x.rows || dx.rows != x.rows ||
      dx.cols != hidden)
    throw_invalid("{} backward with gathered weights (rank {}): dlogits {}x{}, x {}x{}, dx {}x{} do not match the "
                  "forward's [{}, {}] weight",
                  name_, ctx_->tp_rank(), dlogits.rows, dlogits.cols, x.rows, x.cols, dx.rows, dx.cols, full_.dim(0),
                  full_.dim(1));
  matmul(dlogits, full_.mat(), WeightLayout::kKN, dx);
  if (!weight.requires_grad) return;
  grad_full_.resize({vocab, hidden});
  gemm(dlogits, /*trans_a=*/true, x, false, grad_full_.mat());
  grad_shard_.resize(weight.grad.shape());
  reduce_scatter_rows(*ctx_->tp, grad_full_.mat(), grad_shard_.mat(), ctx_->coc.deterministic,
                      name_ + " bwd weight grad")
      .wait();
  add_inplace(weight.grad.mat(), grad_shard_.mat());
}

}  // namespace coc
