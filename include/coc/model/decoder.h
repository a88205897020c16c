// The LLaMA-style decoder (Touvron et al. 2023), tensor-parallel Megatron-style, with explicit forward and backward
// in the manner of Karpathy's llm.c:
//   x0 = VocabParallelEmbedding(tokens)
//   per layer: h = x + RowParallel_o(Attention(RoPE(ColumnParallel_qkv(RMSNorm(x)))))
//              x' = h + RowParallel_down(SwiGLU(ColumnParallel_gate_up(RMSNorm(h))))
//   logits = ColumnParallel_lm_head(RMSNorm(x_L)) → vocab-parallel cross-entropy
// Heads are split across TP ranks (each rank owns heads/T whole heads of q, k and v), the SwiGLU width F is split
// in F/T columns of both gate and up, and the vocabulary in split_rows(V, T, r) rows. With --sequence-parallel,
// the residual stream, norms and embedding output hold this rank's sequence shard [m_r, H]; the column layers
// all-gather it and the row layers reduce-scatter back (Korthikanti et al. 2022).
//
// Initialisation is identical for any tp: each weight element is drawn from a counter-based normal generator keyed
// by (seed, parameter name, element index of the full weight), so a shard draws exactly its elements of the full
// matrix. Output projections use std / sqrt(2·layers) (Megatron's scaled init).
//
// Shapes: tokens/targets are m = S·B ids, sequence-major (index t·B + b). Units: loss in nats (mean over tokens).
#pragma once

#include <memory>
#include <vector>

#include "coc/model/model_config.h"
#include "coc/parallel/context.h"
#include "coc/parallel/linear.h"
#include "coc/parallel/vocab_parallel.h"

namespace coc {

class Decoder {
 public:
  /// Validates cfg against tp (throws uniform kInvalidArgument) and initialises parameters from `seed`.
  Decoder(const ModelConfig& cfg, ParallelContext* ctx, uint64_t seed);
  ~Decoder();

  /// Forward over a micro-batch of `batch` sequences of length S = m / batch; returns the mean loss (nats),
  /// identical on every TP rank. Keeps the activations for backward.
  double forward(const int32_t* tokens, const int32_t* targets, int64_t batch);
  /// Backward of the last forward; gradients are accumulated (+=) scaled by `loss_scale` (1/micro-batches).
  void backward(float loss_scale);
  /// Full-vocabulary logits [V] of the last position of `tokens` (len >= 1), batch 1, for sampling. Runs without
  /// sequence parallelism and without keeping activations. Collective over TP.
  std::vector<float> next_token_logits(const int32_t* tokens, int64_t len);

  ParamList params();
  const ModelConfig& config() const { return cfg_; }

 private:
  struct Layer;
  void init_parameters(uint64_t seed);
  ModelConfig cfg_;
  ParallelContext* ctx_;
  std::unique_ptr<VocabParallelEmbedding> embedding_;
  std::vector<std::unique_ptr<Layer>> layers_;
  Param final_norm_;
  std::unique_ptr<ColumnParallelLinear> lm_head_;
  std::unique_ptr<VocabParallelCrossEntropy> loss_;
  // Activations of the last forward.
  int64_t m_ = 0, batch_ = 0;
  const int32_t* tokens_ = nullptr;
  const int32_t* targets_ = nullptr;
  Tensor x0_, xf_, lnf_, rstdf_, logits_, dlogits_;
};

/// Counter-based N(0, std²) sample for element `index` of the weight named by `key` under `seed`.
float init_normal(uint64_t seed, uint64_t key, uint64_t index, float std);

}  // namespace coc
