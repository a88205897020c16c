// Block attention: the queries of one sequence chunk against one KV block, with the positions of both, returning
// the block's output and its log-sum-exp (LSE) so that partial results over several KV blocks merge exactly
// (online softmax: Milakov & Gimelshein 2018; FlashAttention-2, Dao 2023, whose backward recomputes the
// probabilities from the LSE). Ring attention (parallel/ring_attention.h) calls these once per (query chunk,
// KV chunk) pair it holds; only block-local scores [128 query rows, sk] are ever materialised.
//
// Layout (as transformer_ops.h): q, out [sq·B, heads·D] with row t·B + b for local position t in [0, sq) and batch
// item b; k, v [sk·B, heads·D] likewise; head j occupies columns [j·D, (j+1)·D). Views may be strided. The query at
// local t has global position q_pos0 + t, the key at local s has global position k_pos0 + s.
// lse [sq·B, heads] contiguous: lse[(t·B + b)·heads + j], natural log, fp32; −∞ for a row that sees no key.
// scores = q·kᵀ/√D. All data fp32; under --bf16 the products run on bf16 kernels (transformer_ops.h).
// Errors: ErrorKind::kInternal (COC_ASSERT) on mismatched shapes: callers validate user input.
#pragma once

#include <cstdint>
#include <functional>

#include "coc/core/tensor.h"

namespace coc {

/// Which keys a query sees: kCausal, key position <= query position (Megatron's "causal"); kFull, every key
/// (MindSpeed's --attention-mask-type general with no padding: an all-visible mask).
enum class AttnMask { kCausal, kFull };

/// "causal" / "general".
const char* to_string(AttnMask m);

/// The geometry of one block call: sequence lengths of the query chunk and the KV block, batch, heads, head dim,
/// and the global positions of their first rows.
struct AttnBlock {
  int64_t sq = 0, sk = 0, batch = 1, heads = 1, head_dim = 1;
  int64_t q_pos0 = 0, k_pos0 = 0;
  AttnMask mask = AttnMask::kCausal;
};

/// True when no query of the block sees any key (causal and k_pos0 > the last query position): the block's output
/// is 0 and its lse −∞, and callers may skip it.
bool block_fully_masked(const AttnBlock& g);

/// out = softmax(q·kᵀ/√D + mask)·v over this block's keys (overwritten), lse = log Σ_visible exp(scores)
/// (overwritten). A row that sees no key gets out = 0 and lse = −∞ (no NaN). ~4·B·heads·sq·sk·D FLOPs (less for
/// causal blocks on the diagonal). `between_tiles`, if set, runs after each query tile of each head: ring attention
/// polls its transfers there, because with the inline progress engine MPI moves data only inside MPI calls, and a
/// poll per block left a 1 Gbit/s link idle for most of the block (docs/performance.md, "Ring attention").
void block_attention_forward(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, const AttnBlock& g,
                             MatrixView out, float* lse, const std::function<void()>& between_tiles = nullptr);

/// FlashAttention-2's backward of one block, given the *final* output `out` and `lse` of the query rows (after all
/// blocks were merged), so that P = exp(scores − lse) are this block's share of the full softmax:
///   Δ = rowsum(dO ⊙ O), dV += Pᵀ·dO, dS = P ⊙ (dO·Vᵀ − Δ), dQ += dS·K/√D, dK += dSᵀ·Q/√D.
/// dq [sq·B, heads·D], dk, dv [sk·B, heads·D] are *accumulated* (+=). Rows with lse = −∞ contribute nothing.
/// ~8·B·heads·sq·sk·D FLOPs. `between_tiles` as in the forward.
void block_attention_backward(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, ConstMatrixView out,
                              const float* lse, ConstMatrixView dout, const AttnBlock& g, MatrixView dq, MatrixView dk,
                              MatrixView dv, const std::function<void()>& between_tiles = nullptr);

/// Merges a partial result (part [rows, heads·D], part_lse [rows, heads]) into the running one (acc, acc_lse) of the
/// same query rows, in fp32: L = log(e^acc_lse + e^part_lse), acc = acc·e^(acc_lse − L) + part·e^(part_lse − L).
/// A partial with lse −∞ leaves acc unchanged; two −∞ stay (0, −∞). No NaN for any mix of −∞.
void attention_merge_partial(MatrixView acc, float* acc_lse, ConstMatrixView part, const float* part_lse,
                             int64_t heads, int64_t head_dim);

}  // namespace coc
