#include <cmath>

#include "coc/core/error.h"
#include "coc/kernels/cross_entropy.h"
#include "coc/overlap/partition.h"
#include "coc/parallel/vocab_parallel.h"

namespace coc {

VocabParallelCrossEntropy::VocabParallelCrossEntropy(int64_t vocab, const ParallelContext* ctx)
    : vocab_(vocab), ctx_(ctx) {
  RowRange r = split_rows(vocab_, ctx_->tp_size(), ctx_->tp_rank());
  begin_ = r.begin;
  local_ = r.count;
}

double VocabParallelCrossEntropy::forward(ConstMatrixView logits, const int32_t* targets) {
  const int64_t m = logits.rows;
  stats_begin_ = begin_;
  if (logits.cols != local_)
    throw_invalid("vocab-parallel cross-entropy (rank {}): logits have {} columns, expected this rank's {} of {}",
                  ctx_->tp_rank(), logits.cols, local_, vocab_);
  max_.assign(static_cast<size_t>(m), 0.0f);
  vocab_ce_row_max(logits, max_.data());
  ctx_->tp->all_reduce(max_.data(), m, ReduceOp::kMax, "cross_entropy max").wait();
  // One all-reduce for [sum of exp | target logit] instead of two.
  std::vector<float> st(static_cast<size_t>(2 * m), 0.0f);
  vocab_ce_sum_exp(logits, max_.data(), targets, begin_, st.data(), st.data() + m);
  ctx_->tp->all_reduce(st.data(), 2 * m, ReduceOp::kSum, "cross_entropy sum_exp,target").wait();
  sum_.assign(st.begin(), st.begin() + m);
  std::vector<float> loss(static_cast<size_t>(m));
  vocab_ce_loss(m, st.data(), st.data() + m, loss.data());
  double total = 0;
  for (float l : loss) total += l;
  return m > 0 ? total / static_cast<double>(m) : 0.0;
}

double VocabParallelCrossEntropy::forward_local_rows(ConstMatrixView logits, const int32_t* targets, int64_t m) {
  const int64_t rows = logits.rows;
  if (logits.cols != vocab_ || rows != ctx_->shard_rows(m))
    throw_invalid("cross-entropy on local rows (rank {}): logits are {}x{}, expected this rank's {} of {} rows "
                  "against the whole vocabulary of {}",
                  ctx_->tp_rank(), rows, logits.cols, ctx_->shard_rows(m), m, vocab_);
  stats_begin_ = 0;
  max_.assign(static_cast<size_t>(rows), 0.0f);
  vocab_ce_row_max(logits, max_.data());
  std::vector<float> st(static_cast<size_t>(2 * rows), 0.0f);
  vocab_ce_sum_exp(logits, max_.data(), targets, 0, st.data(), st.data() + rows);
  sum_.assign(st.begin(), st.begin() + rows);
  std::vector<float> loss(static_cast<size_t>(rows));
  vocab_ce_loss(rows, st.data(), st.data() + rows, loss.data());
  double local = 0;
  for (float l : loss) local += l;
  // Reported only (the gradient above needs no other rank's rows), and summed in rank order so that it is the
  // same on every rank and in every run, whatever order the library reduces in.
  double total = 0;
  for (double t : ctx_->tp->all_gather_value(local, "cross_entropy loss")) total += t;
  return m > 0 ? total / static_cast<double>(m) : 0.0;
}

void VocabParallelCrossEntropy::backward(ConstMatrixView logits, const int32_t* targets, float scale,
                                         MatrixView dlogits) {
  vocab_ce_backward(logits, max_.data(), sum_.data(), targets, stats_begin_, scale, dlogits);
}

}  // namespace coc
