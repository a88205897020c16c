#include <algorithm>
#include <cstring>

#include "coc/core/error.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/overlap/partition.h"
#include "coc/parallel/vocab_parallel.h"
#include "coc/runtime/tracer.h"

namespace coc {

VocabParallelEmbedding::VocabParallelEmbedding(std::string name, int64_t vocab, int64_t hidden,
                                               const ParallelContext* ctx)
    : name_(std::move(name)), vocab_(vocab), hidden_(hidden), ctx_(ctx) {
  RowRange r = split_rows(vocab_, ctx_->tp_size(), ctx_->tp_rank());
  begin_ = r.begin;
  weight.name = name_ + ".weight";
  weight.value.resize({r.count, hidden_});
  weight.grad.resize({r.count, hidden_});
}

void VocabParallelEmbedding::forward(const int32_t* tokens, int64_t m, MatrixView out) {
  const bool sp = ctx_->sequence_parallel;
  if (out.cols != hidden_ || out.rows != (sp ? ctx_->shard_rows(m) : m))
    throw_invalid("{} forward (rank {}): output {}x{} does not match m={} hidden={}", name_, ctx_->tp_rank(),
                  out.rows, out.cols, m, hidden_);
  tokens_ = tokens;
  m_ = m;
  for (int64_t i = 0; i < m; ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab_)
      throw_invalid("{}: token id {} at position {} is outside the vocabulary [0, {})", name_, tokens[i], i, vocab_);
  gathered_ = ctx_->gathers_vocab_weights(vocab_, hidden_, m);
  if (gathered_) {
    full_.resize({vocab_, hidden_});
    all_gather_rows(*ctx_->tp, weight.value.mat(), full_.mat(), name_ + " fwd weight").wait();
    const RowRange share = split_rows(m, ctx_->tp_size(), ctx_->tp_rank());
    COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "embedding_forward", {"m", share.count},
                    {"n", hidden_});
    for (int64_t i = 0; i < share.count; ++i)
      std::memcpy(out.row(i), full_.data() + tokens[share.begin + i] * hidden_, static_cast<size_t>(hidden_) * 4);
    return;
  }
  const int64_t local = weight.value.dim(0);
  MatrixView dst = out;
  if (sp) {
    full_.resize({m, hidden_});
    dst = full_.mat();
  }
  {
    COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "embedding_forward", {"m", m}, {"n", hidden_});
    for (int64_t i = 0; i < m; ++i) {
      int64_t l = tokens[i] - begin_;
      if (l >= 0 && l < local)
        std::memcpy(dst.row(i), weight.value.data() + l * hidden_, static_cast<size_t>(hidden_) * 4);
      else
        std::memset(dst.row(i), 0, static_cast<size_t>(hidden_) * 4);
    }
  }
  const std::string tag = name_ + " fwd";
  if (sp)
    reduce_scatter_rows(*ctx_->tp, full_.mat(), out, ctx_->coc.deterministic, tag).wait();
  else
    all_reduce_rows(*ctx_->tp, out, ctx_->coc.deterministic, tag).wait();
}

void VocabParallelEmbedding::backward(ConstMatrixView dout) {
  if (gathered_) {
    // This rank's rows' contributions to every table row, then their sum over TP onto the shards.
    const RowRange share = split_rows(m_, ctx_->tp_size(), ctx_->tp_rank());
    grad_full_.resize({vocab_, hidden_});
    grad_shard_.resize(weight.grad.shape());
    {
      COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "embedding_backward", {"m", share.count},
                      {"n", hidden_});
      std::fill(grad_full_.data(), grad_full_.data() + grad_full_.numel(), 0.0f);
      for (int64_t i = 0; i < share.count; ++i) {
        float* g = grad_full_.data() + tokens_[share.begin + i] * hidden_;
        const float* s = dout.row(i);
        for (int64_t j = 0; j < hidden_; ++j) g[j] += s[j];
      }
    }
    reduce_scatter_rows(*ctx_->tp, grad_full_.mat(), grad_shard_.mat(), ctx_->coc.deterministic,
                        name_ + " bwd weight grad")
        .wait();
    add_inplace(weight.grad.mat(), grad_shard_.mat());
    return;
  }
  ConstMatrixView d = dout;
  if (ctx_->sequence_parallel) {
    full_.resize({m_, hidden_});
    all_gather_rows(*ctx_->tp, dout, full_.mat(), name_ + " bwd").wait();
    d = full_.mat();
  }
  const int64_t local = weight.value.dim(0);
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "embedding_backward", {"m", m_}, {"n", hidden_});
  for (int64_t i = 0; i < m_; ++i) {
    int64_t l = tokens_[i] - begin_;
    if (l < 0 || l >= local) continue;
    float* g = weight.grad.data() + l * hidden_;
    const float* s = d.row(i);
    for (int64_t j = 0; j < hidden_; ++j) g[j] += s[j];
  }
}

}  // namespace coc
