// Single-rank forward/backward kernels of a LLaMA-style decoder, fp32, written llm.c-style (explicit forward and
// backward, readable top to bottom; Karpathy, llm.c train_gpt2.c). Layout conventions:
//  - Activations are matrices [rows, cols] with rows = tokens in sequence-major order: row = t·B + b for
//    position t in [0, S) and batch item b in [0, B) (Megatron's [s, b, h] flattened).
//  - Heads are contiguous column blocks of width D (head_dim): head j occupies columns [j·D, (j+1)·D).
//  - Views may be strided (ld > cols), e.g. column slices of a fused qkv matrix.
// All data is fp32 and dimensionless (activations, gradients); `theta` and `eps` are unitless too.
// Backward functions *accumulate* into parameter gradients (dweight += …) and *overwrite* input gradients
// (dx = …) unless stated otherwise. Outputs must not alias inputs unless stated otherwise.
// Errors: ErrorKind::kInternal (COC_ASSERT) on mismatched shapes or bad sizes — callers validate user input, so a
// failure here is a bug in coc.
#pragma once

#include <cstdint>
#include <vector>

#include "coc/core/dtype.h"
#include "coc/core/tensor.h"

namespace coc {

// ---- RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization"; LLaMA) ----
// y = x / sqrt(mean(x²) + eps) ⊙ w, per row (token) over the H features. No mean subtraction and no bias.

/// x, y [M tokens, H features]; w [H]; rstd [M] receives 1/sqrt(mean(x²)+eps) per row, saved for backward.
/// eps > 0 (LLaMA/Megatron use 1e-5 or 1e-6). y may alias x (each row's statistic is computed before writing).
void rmsnorm_forward(ConstMatrixView x, const float* w, float eps, MatrixView y, float* rstd);
/// dy [M, H] → dx [M, H] (overwritten, or added to if accumulate_dx: the residual-stream gradient); dw [H]
/// accumulated (dw += Σ_rows dy ⊙ x ⊙ rstd). rstd is what rmsnorm_forward produced for the same x.
/// dx = rstd · (g − x · rstd² · mean(g ⊙ x)) with g = dy ⊙ w.
void rmsnorm_backward(ConstMatrixView x, const float* w, const float* rstd, ConstMatrixView dy, MatrixView dx,
                      float* dw, bool accumulate_dx);

// ---- Rotary position embedding (Su et al. 2021, RoFormer; LLaMA/Megatron's rotate-half form) ----
/// Rotates, in place, each head's columns of x [S·B tokens, heads·D] by position t = row / B: pairs
/// (i, i + D/2) for i < D/2 with angle t · theta^(−2i/D) radians (theta = base, 10000 in LLaMA):
///   x'_i = x_i·cos − x_{i+D/2}·sin,  x'_{i+D/2} = x_{i+D/2}·cos + x_i·sin.
/// `inverse` applies the transpose rotation (angle negated): it undoes the forward and is the backward (the
/// rotation is orthogonal, so dx = Rᵀ·dy). D must be even and > 0, batch > 0, x.rows divisible by batch.
/// Angles are computed in fp64 so that long sequences keep their phase accurate.
/// `pos0` shifts every position (t = pos0 + row / B): a chunk of a longer sequence, e.g. a context-parallel rank's
/// zig-zag chunk (parallel/ring_attention.h).
void rope_apply(MatrixView x, int64_t batch, int64_t heads, int64_t head_dim, float theta, bool inverse,
                int64_t pos0 = 0);
/// The same on any rows of the [S·B, heads·D] layout: x holds rows [first_row, first_row + x.rows) of it, so row r
/// has position (first_row + r) / B; no divisibility needed. The bits of rope_apply on the whole matrix, row for
/// row (a CoC chunk's rows, rotated as its GEMM finishes them: TransformerLayer's qkv forward).
void rope_apply_rows(MatrixView x, int64_t first_row, int64_t batch, int64_t heads, int64_t head_dim, float theta,
                     bool inverse);

// ---- Causal multi-head attention core: out = softmax(q·kᵀ/√D + causal mask)·v (Vaswani et al. 2017) ----
// For each (batch item b, head j), the S×D blocks of q, k, v are strided views (start row b, row stride B·ld,
// columns [j·D, (j+1)·D)), so the score and context products are single GEMMs with no gather copies.
// Position t attends to positions s <= t. Softmax is max-subtracted (numerically stable).
// Under --bf16 or --fp16 (gemm_compute_type()) the probabilities are rounded to 16 bits after the fp32 softmax, as
// a 16-bit Megatron model casts them before its context product, and the caller passes q, k, v holding 16-bit
// values. Under --bf16 the products run on oneDNN's bf16 kernels (fp32 sums): each head's q, k, v (and dO) are
// converted once per call (q, k, v once per forward where the caller packs them: AttentionBf16Heads), P is kept
// in bf16 (below) and the softmax gradient dS rounded row by row, so dO and dS are rounded to bf16 as a bf16
// model's autograd rounds them. Why: with oneDNN 2.6 on one Zen 5 core at D = 32 a
// 128×256×32 block product takes 6.2 µs in bf16 against 10.9 µs in fp32, and converting a block's 128×256
// probabilities ~3 µs (whole runs: docs/performance.md point 37). Under --fp16 they run on fp32 kernels: a product
// of two fp16 values is exact in fp32, and no target CPU multiplies fp16. The ring's block attention
// (block_attention.h) does the same per tile, converting P per tile.

/// q, k and v of attention's calls as bf16 operands, converted once per forward (attention_pack_heads_bf16) rather
/// than in every call for every head: the blocks of --attention-dense-pipeline and of the backward's pipelines each
/// read keys [0, block end), so each call converted them again (at S = 1024, 4.5 times over in the forward).
/// Head (b, j)'s S×D block is dense at ((b·heads + j)·S)·D in its array; q holds the query heads, k and v
/// `kv_heads` heads each, query head j reading key/value head j / (heads / kv_heads) (grouped-query attention, as
/// the decoder's repeat of the groups). coc's own layout; the values must be those of the q, k, v views passed with
/// it (the kernels read only these under --bf16, and the views' shapes are checked as always).
struct AttentionBf16Heads {
  const BFloat16* q = nullptr;
  const BFloat16* k = nullptr;
  const BFloat16* v = nullptr;
  int64_t kv_heads = 0;
};
/// Rows [first_row, first_row + x.rows) of an [S·B, heads·D] matrix of bf16 values (row t·B + b holds position t of
/// batch item b) written into AttentionBf16Heads' layout at `dst` (B·heads·S·D elements); exact, since the values
/// are bf16 already. Any row range, so that a CoC chunk's rows go as its GEMM finishes them. Throws kInternal where
/// the rows reach past S·B or x.cols != heads·D.
void attention_pack_heads_bf16(ConstMatrixView x, int64_t first_row, int64_t seq, int64_t batch, int64_t heads,
                               int64_t head_dim, BFloat16* dst);

/// q, k, v: [S·B, heads·D] views (may be column slices of a fused qkv matrix). out [S·B, heads·D] (may be
/// strided, must not alias q, k, v). probs: B·heads·S·S floats, saved for backward, in blocks: the probabilities
/// of query block [t0, t1) (t0 = 128·i, t1 = min(S, t0 + 128)) of head j of batch item b are a dense
/// [t1 − t0, t1] matrix at offset ((b·heads + j)·S + t0)·S, the rest of that block's (t1 − t0)·S floats zero, so
/// that the products read each block without a copy; attention_prob() reads one entry. Masked entries (s > t) are 0.
/// Under --bf16 (gemm_compute_type() kBF16) probs holds B·heads·S·S bf16 elements instead, half the bytes
/// (attention_prob_floats): each block a dense [t1 − t0, t1] bf16 matrix at the same offset counted in bf16
/// elements, the rest of the block's bytes left as they were. The values are those the fp32 layout would hold
/// rounded to bf16, so the backward's bits do not change; what changes is one conversion pass less in the forward
/// and two in the backward (the products read the block as it is), and half the bytes written, read and kept
/// (docs/performance.md points 43 and 48). The backward must run under the forward's compute type.
/// Queries go in blocks of 128 rows against only the keys they may see (FlashAttention's causal block skipping, Dao
/// et al. 2022): ~2·B·heads·S·(S + 128)·D FLOPs in GEMMs for S >= 128 (about half of the full-square
/// 4·B·heads·S²·D for S >> 128; one block, the full square, below 128).
/// `packed` (all four functions): the same q, k, v as bf16 operands (AttentionBf16Heads), read instead of q, k, v
/// under --bf16; ignored in the other compute types.
void attention_forward(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, int64_t batch, int64_t heads,
                       int64_t head_dim, MatrixView out, float* probs, const AttentionBf16Heads* packed = nullptr);
/// Query positions per block of attention_forward.
inline constexpr int64_t kAttentionBlockRows = 128;
/// The floats attention_forward's probs takes for `heads` heads of `batch` items of `seq` positions under compute
/// type `ct`: B·heads·S·S, or half as many (rounded up) under kBF16, whose elements are bf16.
inline int64_t attention_prob_floats(int64_t batch, int64_t heads, int64_t seq, DType ct) {
  const int64_t n = batch * heads * seq * seq;
  return ct == DType::kBF16 ? (n + 1) / 2 : n;
}
/// P(t attends s) of head bh = b·heads + j in attention_forward's probs (their block layout above), written under
/// compute type `ct` (kBF16: the bf16 blocks).
inline float attention_prob(const float* probs, int64_t S, int64_t bh, int64_t t, int64_t s,
                            DType ct = DType::kF32) {
  const int64_t t0 = t / kAttentionBlockRows * kAttentionBlockRows, t1 = std::min(S, t0 + kAttentionBlockRows);
  if (s >= t1) return 0.0f;
  const int64_t at = (bh * S + t0) * S + (t - t0) * t1 + s;  // in elements of the compute type
  if (ct == DType::kBF16) return bf16_to_float(reinterpret_cast<const BFloat16*>(probs)[at]);
  return probs[at];
}
/// attention_forward for the query positions of blocks [first_block, last_block) only: positions
/// [first_block·128, min(S, last_block·128)), every batch item and head; the rows of `out` and `probs` of the other
/// positions are left as they are. The blocks' GEMM calls are attention_forward's own, so computing the blocks in
/// any grouping and order gives its bits exactly (the decoder feeds the output projection block by block,
/// --attention-dense-pipeline). 0 <= first_block <= last_block <= ceil(S / 128).
void attention_forward_blocks(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, int64_t batch, int64_t heads,
                              int64_t head_dim, MatrixView out, float* probs, int64_t first_block,
                              int64_t last_block, const AttentionBf16Heads* packed = nullptr);
/// dout [S·B, heads·D] → dq, dk, dv (overwritten; same layout as q, k, v; may be column slices of one fused
/// dqkv matrix). probs is what attention_forward wrote. Uses a 128×S scratch buffer and dense copies of one head's
/// q, k, v, dout, dk, dv (6·S·D floats; kernels/dense_head.h says why). Standard softmax backward:
/// dP = dO·vᵀ, dS = P ⊙ (dP − rowsum(dP ⊙ P)), dq = dS·k/√D, dk = dSᵀ·q/√D, dv = Pᵀ·dO. In the same query blocks,
/// ~4·B·heads·S·(S + 128)·D FLOPs.
void attention_backward(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, const float* probs,
                        ConstMatrixView dout, int64_t batch, int64_t heads, int64_t head_dim, MatrixView dq,
                        MatrixView dk, MatrixView dv, const AttentionBf16Heads* packed = nullptr);
/// attention_backward for the query positions of blocks [first_block, last_block) only (positions
/// [first_block·128, min(S, last_block·128)), every batch item and head): writes their rows of dq and adds their
/// share to every row of dk and dv they reach. dk and dv accumulate from the last block down, as in the whole
/// call, so the calls must cover the blocks exactly once, from the last block down (the first call holds the last
/// block, which initialises dk and dv; each later call's blocks lie below the previous call's). Then the bits are
/// attention_backward's, in any grouping (the decoder runs the blocks as the output projection's backward hands
/// out their rows of dout, --attention-dense-backward-pipeline). 0 <= first_block <= last_block <= ceil(S / 128).
/// `dkv_heads` (optional, any compute type): 2·B·heads·S·D floats the caller keeps for the calls of one backward,
/// where dk and dv accumulate between them (dk's heads, then dv's, head (b, j) dense at ((b·heads + j)·S)·D); the
/// first call of a backward, which holds the last block as above, initialises it. Each call then writes only the
/// rows of dk and dv it completes, positions [first_block·128, min(S, last_block·128)): a key has every query once
/// the blocks from its own up are done. Without it each call reads rows [0, end) of dk
/// and dv back in and writes them out again, which across one call per block grows with the square of the blocks.
/// The same bits either way.
void attention_backward_blocks(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, const float* probs,
                               ConstMatrixView dout, int64_t batch, int64_t heads, int64_t head_dim, MatrixView dq,
                               MatrixView dk, MatrixView dv, int64_t first_block, int64_t last_block,
                               const AttentionBf16Heads* packed = nullptr, float* dkv_heads = nullptr);

// ---- SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"): out = silu(gate) ⊙ up ----
// silu(g) = g·σ(g) (Swish-1, Ramachandran et al. 2017).

/// gate, up, out [M tokens, F features]. out may alias gate or up. out16 ([M, F] or empty): also out's bf16 values
/// (nearest even), written while each row is in cache, for the down projection's GEMMs (GemmOperandCopy::fill_rows).
void swiglu_forward(ConstMatrixView gate, ConstMatrixView up, MatrixView out, MatrixViewT<BFloat16> out16 = {});
/// dout [M, F] → dgate, dup [M, F] (overwritten): dup = dout ⊙ silu(gate),
/// dgate = dout ⊙ up ⊙ σ(gate)·(1 + gate·(1 − σ(gate))). dgate/dup may alias dout (elementwise, read first).
/// dgate16, dup16 (both [M, F] or both empty): also the bf16 values of dgate and dup (nearest even), written
/// while each row is in cache, for the GEMMs of gate/up's backward (GemmOperandCopy::fill_rows): rounding the
/// whole of dgate and dup afterwards read them from memory again (about 4 ms a layer at cluster-e2e's shape).
void swiglu_backward(ConstMatrixView gate, ConstMatrixView up, ConstMatrixView dout, MatrixView dgate, MatrixView dup,
                     MatrixViewT<BFloat16> dgate16 = {}, MatrixViewT<BFloat16> dup16 = {});

// ---- Elementwise helpers ----
/// y += x (same shapes [rows, cols]; either may be strided). The residual add.
void add_inplace(MatrixView y, ConstMatrixView x);
/// Copies x into y (same shapes; either may be strided; must not overlap unless identical).
void copy(ConstMatrixView x, MatrixView y);
/// Σ x² over all elements of t (fp32), accumulated in fp64 in index order (the local part of a gradient norm).
double sum_squares(const Tensor& t);

}  // namespace coc
