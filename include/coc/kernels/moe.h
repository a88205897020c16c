// Single-rank kernels of a mixture-of-experts layer (fp32): the grouped GEMM of the experts, the softmax top-k
// router with Megatron's capacity-based token dropping, and the Switch/GShard load-balancing loss.
// Layout conventions as in transformer_ops.h: activations are [tokens, features], row-major.
// Errors: kInternal (COC_ASSERT) on mismatched shapes; callers validate user input (parallel/moe.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "coc/core/tensor.h"

namespace coc {

// ---- Grouped GEMM: one GEMM per expert over its contiguous rows ----------------------------------------------
// Rows of x are grouped by expert: expert g owns rows [offset_g, offset_g + rows[g]) with offset_g = Σ_{h<g}
// rows[h]. w holds the experts' weights stacked, expert g's [n, k] block (Megatron's [out, in]) at rows
// [g·n, (g+1)·n). An expert with 0 rows costs nothing and gets no gradient (exactly zero added).

/// y[rows of g] = x[rows of g] · w_gᵀ. x [Σrows, k], w [G·n, k], y [Σrows, n].
void grouped_gemm_forward(ConstMatrixView x, std::span<const int64_t> rows, ConstMatrixView w, MatrixView y);
/// dx[rows of g] = dy[rows of g] · w_g (overwritten); dx may be an empty view (rows 0) to skip it.
void grouped_gemm_backward_data(ConstMatrixView dy, std::span<const int64_t> rows, ConstMatrixView w, MatrixView dx);
/// dw_g += dy[rows of g]ᵀ · x[rows of g] (accumulated; one GEMM per expert over all its rows, in row order).
void grouped_gemm_backward_weight(ConstMatrixView x, ConstMatrixView dy, std::span<const int64_t> rows,
                                  MatrixView dw);

// ---- Softmax top-k router (Megatron-core's TopKRouter with moe_router_pre_softmax; Shazeer et al. 2017) -------

/// The routing of T tokens over E experts with top-k K: slot (t, j) for j < K.
struct Routing {
  int64_t tokens = 0;
  int experts = 0, topk = 0;
  std::vector<float> probs;       ///< [T, E] softmax of the logits (saved for backward)
  std::vector<int32_t> expert;    ///< [T, K] chosen expert of each slot (distinct per token)
  std::vector<float> weight;      ///< [T, K] probs[t, expert[t, j]]; 0 when dropped
  std::vector<uint8_t> kept;      ///< [T, K] 1 unless dropped by the capacity
  std::vector<int64_t> counts;    ///< [E] slots routed to each expert before dropping (the aux loss's f_e)
  std::vector<double> prob_sums;  ///< [E] Σ_t probs[t, e], in token order (the aux loss's P_e)
};

/// Forces the choice of experts (MindSpeed-LLM's fix_router, for debugging and checks): slot (t, j) of the token
/// with global index g goes to a fixed expert; the weights stay the router's probabilities there, so the router
/// still learns. kBalanced: (g + j) mod E. kSkewed: 90% of tokens (g mod 10 != 9) first choose expert 0, the rest
/// 1 + g mod (E − 1); later slots follow cyclically. kEmpty: only the first U = max(K, E/2) experts receive
/// tokens ((g + j) mod U), so the others (and with E/2 experts per rank, whole ranks) get none.
enum class RouterPattern { kNone, kBalanced, kSkewed, kEmpty };
const char* to_string(RouterPattern p);

/// logits [T, E] → Routing. Softmax over E (max-subtracted, fp32 with the vec_math exp), then the top-k by
/// probability (ties: the lower expert index), or the fixed pattern (`token_offset` = global index of row 0).
/// capacity_factor > 0 drops tokens as Megatron's "probs" drop policy: each expert keeps its
/// ceil(T·K/E · capacity_factor) slots of highest probability (ties: earlier token) over these T tokens.
Routing route_topk(ConstMatrixView logits, int topk, RouterPattern pattern, int64_t token_offset,
                   double capacity_factor);

/// The capacity of each expert under `capacity_factor` for T tokens (Megatron's get_capacity).
int64_t expert_capacity(int64_t tokens, int topk, int experts, double capacity_factor);

/// Router backward: dweight [T, K] (the gradient of the top-k weights; dropped slots ignored) plus dprobs_extra
/// [T, E] (the aux loss's gradient, may be empty) → dlogits [T, E] (overwritten) through the softmax:
/// dlogit = p ⊙ (dp − Σ p·dp).
void route_topk_backward(const Routing& r, std::span<const float> dweight, std::span<const float> dprobs_extra,
                         MatrixView dlogits);

// ---- Load-balancing loss (Switch Transformer, Fedus et al. 2021; GShard): coeff · E · Σ_e f_e · P_e -----------
// f_e = counts_e / (T·K) (fraction of slots routed to e), P_e = prob_sums_e / T (mean router probability), both
// over the GLOBAL batch of T tokens (the caller sums counts and prob_sums over the data-parallel ranks first), so
// neither the value nor the gradient depends on how the batch is split (Megatron's
// switch_load_balancing_loss_func with the global token count).

double aux_loss_value(std::span<const int64_t> counts, std::span<const double> prob_sums, int64_t global_tokens,
                      int topk, double coeff);
/// dprobs[t, e] += scale · coeff · E · f_e / T_global for each local token t (the loss's partial derivative;
/// counts are not differentiable). dprobs [T_local, E].
void aux_loss_backward(std::span<const int64_t> counts, int64_t global_tokens, int topk, double coeff, double scale,
                       MatrixView dprobs);

}  // namespace coc
