// Vocab-parallel embedding and cross-entropy (Megatron: VocabParallelEmbedding in tensor_parallel/layers.py and
// _VocabParallelCrossEntropy in tensor_parallel/cross_entropy.py). The vocabulary V is split across the T ranks
// of the TP group in contiguous ranges split_rows(V, T, r) (uneven allowed, so V = 256 works with tp = 3).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coc/parallel/context.h"
#include "coc/parallel/param.h"

namespace coc {

/// Embedding table shard [V_r, H]. Forward looks up local ids (zero rows for ids owned by other ranks) and
/// reduces over TP: all-reduce to [m, H] (SP off) or reduce-scatter to [m_r, H] (SP on).
class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding(std::string name, int64_t vocab, int64_t hidden, ParallelContext* ctx);
  /// tokens: m ids in [0, V) (sequence-major). out: [m, H] or [m_r, H] (SP). Throws kInvalidArgument for an id
  /// outside the vocabulary.
  void forward(const int32_t* tokens, int64_t m, MatrixView out);
  /// dout: [m, H] or [m_r, H] (SP). Accumulates into weight.grad.
  void backward(ConstMatrixView dout);
  int64_t vocab_begin() const { return begin_; }
  ParamList params() { return {&weight}; }

  Param weight;

 private:
  std::string name_;
  int64_t vocab_, hidden_, begin_;
  ParallelContext* ctx_;
  const int32_t* tokens_ = nullptr;
  int64_t m_ = 0;
  Tensor full_;  // [m, H] before the reduction / gathered gradient
};

/// Cross-entropy over vocab-sharded logits [m, V_r] (every rank holds the same m rows, its own vocab columns).
/// Three TP all-reduces of [m] vectors (max; sum of exp and target logit) instead of gathering [m, V].
class VocabParallelCrossEntropy {
 public:
  VocabParallelCrossEntropy(int64_t vocab, ParallelContext* ctx);
  /// Returns the mean loss over the m rows (nats). Saves softmax statistics for backward.
  double forward(ConstMatrixView logits, const int32_t* targets);
  /// dlogits [m, V_r] = (softmax − onehot) · scale (scale = 1/m for the mean, times any micro-batch factor).
  void backward(ConstMatrixView logits, const int32_t* targets, float scale, MatrixView dlogits);

 private:
  int64_t vocab_, begin_, local_;
  ParallelContext* ctx_;
  std::vector<float> max_, sum_;  // per row: global max and global sum of exp(logit − max)
};

}  // namespace coc
