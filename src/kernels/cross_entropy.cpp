// Local pieces of the vocab-parallel cross-entropy (Megatron-LM's _VocabParallelCrossEntropy). See the header for
// the collective sequence the caller runs between them.
#include "coc/kernels/cross_entropy.h"
#include "coc/runtime/tracer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "coc/core/error.h"

namespace coc {

void vocab_ce_row_max(ConstMatrixView logits, float* row_max) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "vocab_ce_row_max",
                  {"m", logits.rows}, {"n", logits.cols});
  for (int64_t i = 0; i < logits.rows; ++i) {
    const float* r = logits.row(i);
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t v = 0; v < logits.cols; ++v) mx = std::max(mx, r[v]);
    row_max[i] = mx;
  }
}

void vocab_ce_sum_exp(ConstMatrixView logits, const float* global_max, const int32_t* targets, int64_t vocab_begin,
                      float* local_sum_exp, float* local_target) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "vocab_ce_sum_exp",
                  {"m", logits.rows}, {"n", logits.cols});
  COC_ASSERT(vocab_begin >= 0, "vocab_ce_sum_exp: vocab_begin {}", vocab_begin);
  for (int64_t i = 0; i < logits.rows; ++i) {
    const float* r = logits.row(i);
    const float mx = global_max[i];
    // Summed in fp64: Vl is up to ~32k terms per row and the loss is log of this sum.
    double sum = 0.0;
    for (int64_t v = 0; v < logits.cols; ++v) sum += std::exp(r[v] - mx);
    local_sum_exp[i] = static_cast<float>(sum);
    const int64_t local = static_cast<int64_t>(targets[i]) - vocab_begin;
    local_target[i] = (local >= 0 && local < logits.cols) ? r[local] - mx : 0.0f;
  }
}

void vocab_ce_loss(int64_t rows, const float* sum_exp, const float* target, float* loss) {
  for (int64_t i = 0; i < rows; ++i) loss[i] = std::log(sum_exp[i]) - target[i];
}

void vocab_ce_backward(ConstMatrixView logits, const float* global_max, const float* global_sum_exp,
                       const int32_t* targets, int64_t vocab_begin, float scale, MatrixView dlogits) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "vocab_ce_backward",
                  {"m", logits.rows}, {"n", logits.cols});
  COC_ASSERT(dlogits.rows == logits.rows && dlogits.cols == logits.cols,
             "vocab_ce_backward: logits [{}, {}], dlogits [{}, {}]", logits.rows, logits.cols, dlogits.rows,
             dlogits.cols);
  COC_ASSERT(vocab_begin >= 0, "vocab_ce_backward: vocab_begin {}", vocab_begin);
  for (int64_t i = 0; i < logits.rows; ++i) {
    const float* r = logits.row(i);
    float* d = dlogits.row(i);
    const float mx = global_max[i];
    const float inv = scale / global_sum_exp[i];  // folds the softmax normaliser and the loss scale together
    for (int64_t v = 0; v < logits.cols; ++v) d[v] = std::exp(r[v] - mx) * inv;
    const int64_t local = static_cast<int64_t>(targets[i]) - vocab_begin;
    if (local >= 0 && local < logits.cols) d[local] -= scale;
  }
}

}  // namespace coc
