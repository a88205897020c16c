// Vocab-parallel embedding and cross-entropy (Megatron: VocabParallelEmbedding in tensor_parallel/layers.py and
// _VocabParallelCrossEntropy in tensor_parallel/cross_entropy.py). The vocabulary V is split across the T ranks
// of the TP group in contiguous ranges split_rows(V, T, r) (uneven allowed, so V = 256 works with tp = 3).
// Under sequence parallelism they communicate either activations (Megatron) or the weights and their gradients
// (ParallelContext::vocab_comm, VocabComm in context.h, decided per micro-batch by gathers_vocab_weights).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coc/parallel/context.h"
#include "coc/parallel/param.h"

namespace coc {

/// Embedding table shard [V_r, H]. Forward looks up local ids (zero rows for ids owned by other ranks) and
/// reduces over TP: all-reduce to [m, H] (SP off) or reduce-scatter to [m_r, H] (SP on). With VocabComm::kWeights
/// it gathers the table [V, H] instead, looks up this rank's m_r rows in it, and its backward reduce-scatters the
/// [V, H] table gradient of those rows to the shards.
class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding(std::string name, int64_t vocab, int64_t hidden, const ParallelContext* ctx);
  /// tokens: m ids in [0, V) (sequence-major). out: [m, H] or [m_r, H] (SP). Throws kInvalidArgument for an id
  /// outside the vocabulary.
  void forward(const int32_t* tokens, int64_t m, MatrixView out);
  /// dout: [m, H] or [m_r, H] (SP). Accumulates into weight.grad.
  void backward(ConstMatrixView dout);
  /// The m token ids backward reads from now on: those forward was given for the micro-batch whose backward comes
  /// next (a pipeline stage runs several forwards before their backwards; model/pipeline_schedule.h). The micro-batch
  /// must have the last forward's m. Not collective.
  void set_backward_tokens(const int32_t* tokens) { tokens_ = tokens; }
  int64_t vocab_begin() const { return begin_; }
  /// Reads `ctx` (same TP group) from the next call on, as ColumnParallelLinear::set_context.
  void set_context(const ParallelContext* ctx) { ctx_ = ctx; }
  ParamList params() { return {&weight}; }

  Param weight;

 private:
  std::string name_;
  int64_t vocab_, hidden_, begin_;
  const ParallelContext* ctx_;
  const int32_t* tokens_ = nullptr;
  int64_t m_ = 0;
  bool gathered_ = false;  // this micro-batch took the kWeights path
  Tensor full_;  // [m, H] before the reduction / gathered gradient; kWeights: the gathered table [V, H]
  Tensor grad_full_, grad_shard_;  // kWeights backward: [V, H] partial table gradient, [V_r, H] its reduced shard
};

/// The output layer's kWeights path (VocabComm, context.h): logits [m_r, V] = X_r · Wᵀ for this rank's m_r rows
/// against the whole vocabulary, W [V, H] gathered from the shards [V_r, H] of `weight` (the output layer's
/// ColumnParallelLinear weight, whose rows are split_rows(V, T, r)). Backward: dX_r = dlogits · W (no
/// communication) and the [V, H] gradient dlogitsᵀ · X_r, reduce-scattered over TP and added to the shard's grad.
/// fp32. Megatron has no such path (coc's own).
class GatheredVocabHead {
 public:
  GatheredVocabHead(std::string name, const ParallelContext* ctx) : name_(std::move(name)), ctx_(ctx) {}
  /// x: [m_r, H] (this rank's sequence-parallel rows); logits: [m_r, V].
  void forward(const Param& weight, ConstMatrixView x, MatrixView logits);
  /// dlogits: [m_r, V]; x: the forward's input; dx: [m_r, H] (overwritten). Accumulates into weight.grad.
  void backward(Param& weight, ConstMatrixView dlogits, ConstMatrixView x, MatrixView dx);
  /// As VocabParallelEmbedding::set_context.
  void set_context(const ParallelContext* ctx) { ctx_ = ctx; }

 private:
  std::string name_;
  const ParallelContext* ctx_;
  Tensor full_, grad_full_, grad_shard_;  // [V, H] weight, [V, H] partial gradient, [V_r, H] reduced shard
};

/// Cross-entropy over vocab-sharded logits [m, V_r] (every rank holds the same m rows, its own vocab columns).
/// Three TP all-reduces of [m] vectors (max; sum of exp and target logit) instead of gathering [m, V].
class VocabParallelCrossEntropy {
 public:
  VocabParallelCrossEntropy(int64_t vocab, const ParallelContext* ctx);
  /// Returns the mean loss over the m rows (nats). Saves softmax statistics for backward.
  double forward(ConstMatrixView logits, const int32_t* targets);
  /// The kWeights form: logits [m_r, V] hold this rank's sequence-parallel rows of an m-row micro-batch against
  /// the whole vocabulary, `targets` their m_r targets. No statistics cross the TP group; the losses do (one
  /// all-gather of a double, summed in rank order), so every rank returns the mean over all m rows. backward() then takes the same
  /// [m_r, V] shapes.
  double forward_local_rows(ConstMatrixView logits, const int32_t* targets, int64_t m);
  /// dlogits [m, V_r] = (softmax − onehot) · scale (scale = 1/m for the mean, times any micro-batch factor).
  void backward(ConstMatrixView logits, const int32_t* targets, float scale, MatrixView dlogits);
  /// As VocabParallelEmbedding::set_context.
  void set_context(const ParallelContext* ctx) { ctx_ = ctx; }

 private:
  int64_t vocab_, begin_, local_;
  int64_t stats_begin_ = 0;  // vocab column of logits' first column in the last forward (begin_, or 0 for local rows)
  const ParallelContext* ctx_;
  std::vector<float> max_, sum_;  // per row: global max and global sum of exp(logit − max)
};

}  // namespace coc
