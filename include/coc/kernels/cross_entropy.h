// Vocab-parallel softmax cross-entropy, split into the local pieces that run between the caller's collectives.
//
// Algorithm: Megatron-LM's _VocabParallelCrossEntropy (megatron/core/tensor_parallel/cross_entropy.py; Shoeybi
// et al. 2019). Each of the T tensor-parallel ranks holds the logits of a contiguous vocab slice
// [vocab_begin, vocab_begin + Vl) for all M tokens, so the full [M, V] logits are never gathered:
//   1. m_loc  = vocab_ce_row_max(logits)                      → all-reduce MAX over TP → m      [M]
//   2. (s_loc, z_loc) = vocab_ce_sum_exp(logits, m, targets)   → all-reduce SUM over TP → s, z   [M] each
//      s = Σ_v exp(logit_v − m),  z = logit_target − m (only the rank owning the target contributes; others 0)
//   3. loss = vocab_ce_loss(m, s, z) = log(s) − z              (identical on every TP rank)       [M]
//   4. dlogits = vocab_ce_backward(...) = (softmax − onehot) · scale                            [M, Vl]
// With T = 1 the same calls work with no collectives (vocab_begin = 0, Vl = V).
// Units: logits are unnormalised log-probabilities (nats); loss is in nats per token. All fp32. Every [M] array
// is contiguous; logits/dlogits are [M tokens, Vl local vocab] row-major views (may be strided). Targets are
// global token ids in [0, V); the caller validates them (these kernels cannot see V).
// Errors: ErrorKind::kInternal on mismatched shapes (a coc bug; user input is validated upstream).
#pragma once

#include <cstdint>

#include "coc/core/tensor.h"

namespace coc {

/// Step 1. logits [M, Vl] → row_max [M]: max over the local vocab slice (−inf if Vl == 0, the identity of MAX).
void vocab_ce_row_max(ConstMatrixView logits, float* row_max);

/// Step 2. Given global_max [M] (the all-reduced row max), writes for each row i:
///   local_sum_exp[i] = Σ_{v < Vl} exp(logits[i, v] − global_max[i])                          [M]
///   local_target[i]  = logits[i, targets[i] − vocab_begin] − global_max[i] if the target is in this rank's
///                      slice [vocab_begin, vocab_begin + Vl), else 0                            [M]
/// (local_target is Megatron's `predicted_logits`: the target logit shifted by the max, so that after the SUM
/// all-reduce loss = log(sum_exp) − target needs no re-adding of a large max.) targets [M] are global ids.
void vocab_ce_sum_exp(ConstMatrixView logits, const float* global_max, const int32_t* targets, int64_t vocab_begin,
                      float* local_sum_exp, float* local_target);

/// Step 3. loss[i] = log(sum_exp[i]) − target[i] for i < rows, from the all-reduced sum_exp and target of step 2
/// (nats; −log softmax(logits)[target]). Summing/averaging over tokens and micro-batches is the caller's job.
void vocab_ce_loss(int64_t rows, const float* sum_exp, const float* target, float* loss);

/// Step 4 (backward). dlogits [M, Vl] = (exp(logits − global_max)/global_sum_exp − onehot(targets − vocab_begin))
/// · scale, where scale is ∂L/∂loss_i for every token (e.g. 1/(tokens · micro-batches) for a mean loss).
/// The softmax is recomputed from logits rather than stored: one exp per element, but no second [M, Vl] buffer.
/// dlogits may alias logits (each element is read before it is written).
void vocab_ce_backward(ConstMatrixView logits, const float* global_max, const float* global_sum_exp,
                       const int32_t* targets, int64_t vocab_begin, float scale, MatrixView dlogits);

}  // namespace coc
