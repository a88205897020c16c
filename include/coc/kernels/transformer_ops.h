// Single-rank forward/backward kernels of a LLaMA-style decoder, fp32, written llm.c-style (explicit forward and
// backward, readable top to bottom). Layout conventions:
//  - Activations are matrices [rows, cols] with rows = tokens in sequence-major order: row = t·B + b for
//    position t in [0, S) and batch item b in [0, B) (Megatron's [s, b, h] flattened).
//  - Heads are contiguous column blocks of width D (head_dim): head j occupies columns [j·D, (j+1)·D).
// Backward functions *accumulate* into parameter gradients (dweight += …) and *overwrite* input gradients
// (dx = …) unless stated otherwise. Errors: kInternal on mismatched shapes (callers validate user input).
#pragma once

#include <cstdint>
#include <vector>

#include "coc/core/tensor.h"

namespace coc {

// ---- RMSNorm (Zhang & Sennrich 2019; LLaMA): y = x / sqrt(mean(x²) + eps) · w ----
/// x, y [M, H]; w [H]; rstd [M] receives 1/sqrt(mean(x²)+eps) for backward.
void rmsnorm_forward(ConstMatrixView x, const float* w, float eps, MatrixView y, float* rstd);
/// dy [M, H] → dx [M, H] (overwritten, or added to if accumulate_dx); dw [H] accumulated.
void rmsnorm_backward(ConstMatrixView x, const float* w, const float* rstd, ConstMatrixView dy, MatrixView dx,
                      float* dw, bool accumulate_dx);

// ---- Rotary position embedding (Su et al. 2021, RoFormer; LLaMA's rotate-half form) ----
/// Rotates, in place, each head's columns of x [S·B, heads·D] by position t = row / B: pairs (i, i + D/2) for
/// i < D/2 with angle t · theta^(−2i/D). D must be even. `inverse` applies the transpose rotation (backward).
void rope_apply(MatrixView x, int64_t batch, int64_t heads, int64_t head_dim, float theta, bool inverse);

// ---- Causal multi-head attention core (softmax(q·kᵀ/√D + causal mask)·v) ----
/// q, k, v: [S·B, heads·D] views (may be column slices of a fused qkv matrix). out [S·B, heads·D].
/// probs: [B, heads, S, S] (saved for backward; masked entries 0).
void attention_forward(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, int64_t batch, int64_t heads,
                       int64_t head_dim, MatrixView out, float* probs);
/// dout [S·B, heads·D] → dq, dk, dv (overwritten; same layout as q, k, v).
void attention_backward(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, const float* probs,
                        ConstMatrixView dout, int64_t batch, int64_t heads, int64_t head_dim, MatrixView dq,
                        MatrixView dk, MatrixView dv);

// ---- SwiGLU (Shazeer 2020): out = silu(gate) ⊙ up ----
/// gate, up, out [M, F].
void swiglu_forward(ConstMatrixView gate, ConstMatrixView up, MatrixView out);
/// dout [M, F] → dgate, dup [M, F] (overwritten).
void swiglu_backward(ConstMatrixView gate, ConstMatrixView up, ConstMatrixView dout, MatrixView dgate,
                     MatrixView dup);

// ---- Elementwise helpers ----
/// y += x (same shapes).
void add_inplace(MatrixView y, ConstMatrixView x);
/// Copies x into y (same shapes).
void copy(ConstMatrixView x, MatrixView y);

}  // namespace coc
