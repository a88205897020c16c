// Causal multi-head attention core, forward and backward, over per-(batch, head) strided views and GEMMs.
// Forward: scores = q·kᵀ/√D (Vaswani et al. 2017), causal mask, max-subtracted softmax, out = P·v.
// Backward follows llm.c's attention_backward, with its O(S²·D) loops replaced by GEMMs.
#include <algorithm>
#include <cmath>
#include <vector>

#include "coc/core/error.h"
#include "coc/kernels/gemm.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/runtime/tracer.h"

namespace coc {

namespace {

struct AttnShape {
  int64_t seq, batch, heads, dim;
};

AttnShape check_shape(const char* op, ConstMatrixView q, int64_t batch, int64_t heads, int64_t head_dim) {
  COC_ASSERT(batch > 0 && heads > 0 && head_dim > 0, "{}: batch {}, heads {}, head_dim {}", op, batch, heads, head_dim);
  COC_ASSERT(q.rows % batch == 0 && q.cols == heads * head_dim, "{}: q [{}, {}] for B {}, heads {}, D {}", op, q.rows,
             q.cols, batch, heads, head_dim);
  return {q.rows / batch, batch, heads, head_dim};
}

template <typename T>
void check_same(const char* op, const char* name, MatrixViewT<T> m, ConstMatrixView q) {
  COC_ASSERT(m.rows == q.rows && m.cols == q.cols, "{}: {} [{}, {}] differs from q [{}, {}]", op, name, m.rows, m.cols,
             q.rows, q.cols);
}

/// The S×D block of (batch item b, head j): rows t·B + b for t in [0, S), columns [j·D, (j+1)·D).
template <typename T>
MatrixViewT<T> head_block(MatrixViewT<T> m, const AttnShape& s, int64_t b, int64_t j) {
  return {m.data + b * m.ld + j * s.dim, s.seq, s.dim, s.batch * m.ld};
}

}  // namespace

void attention_forward(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, int64_t batch, int64_t heads,
                       int64_t head_dim, MatrixView out, float* probs) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel1, "attention_forward",
                  {"batch", batch}, {"heads", heads}, {"head_dim", head_dim}, {"rows", q.rows});
  const AttnShape s = check_shape("attention_forward", q, batch, heads, head_dim);
  check_same("attention_forward", "k", k, q);
  check_same("attention_forward", "v", v, q);
  check_same("attention_forward", "out", out, q);
  const int64_t S = s.seq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < heads; ++j) {
      MatrixView p{probs + (b * heads + j) * S * S, S, S, S};
      // Scores for all (t, s) in one GEMM: computing the masked upper triangle too costs at most 2× the FLOPs of
      // a triangular product but keeps this a single BLAS call.
      gemm(head_block(q, s, b, j), false, head_block(k, s, b, j), true, p, scale, 0.0f);
      for (int64_t t = 0; t < S; ++t) {
        float* row = p.row(t);
        // Subtracting the row max makes every exponent <= 0, so exp never overflows (stable softmax).
        float mx = row[0];
        for (int64_t c = 1; c <= t; ++c) mx = std::max(mx, row[c]);
        float sum = 0.0f;
        for (int64_t c = 0; c <= t; ++c) {
          row[c] = std::exp(row[c] - mx);
          sum += row[c];
        }
        const float inv = 1.0f / sum;  // sum >= 1 (the max term is exp(0))
        for (int64_t c = 0; c <= t; ++c) row[c] *= inv;
        std::fill(row + t + 1, row + S, 0.0f);  // causal mask: zeros so that P·v ignores the future
      }
      gemm(p, false, head_block(v, s, b, j), false, head_block(out, s, b, j), 1.0f, 0.0f);
    }
  }
}

void attention_backward(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, const float* probs,
                        ConstMatrixView dout, int64_t batch, int64_t heads, int64_t head_dim, MatrixView dq,
                        MatrixView dk, MatrixView dv) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel1, "attention_backward",
                  {"rows", q.rows}, {"cols", q.cols});
  const AttnShape s = check_shape("attention_backward", q, batch, heads, head_dim);
  check_same("attention_backward", "k", k, q);
  check_same("attention_backward", "v", v, q);
  check_same("attention_backward", "dout", dout, q);
  check_same("attention_backward", "dq", dq, q);
  check_same("attention_backward", "dk", dk, q);
  check_same("attention_backward", "dv", dv, q);
  const int64_t S = s.seq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> scratch(static_cast<size_t>(S * S));
  MatrixView ds{scratch.data(), S, S, S};
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < heads; ++j) {
      ConstMatrixView p{probs + (b * heads + j) * S * S, S, S, S};
      ConstMatrixView dob = head_block(dout, s, b, j);
      // dv = Pᵀ·dO.
      gemm(p, true, dob, false, head_block(dv, s, b, j), 1.0f, 0.0f);
      // dP = dO·vᵀ, then the softmax backward in place: dS = P ⊙ (dP − Σ_c P·dP). Masked entries have P = 0,
      // so dS is 0 there and the mask needs no separate gradient.
      gemm(dob, false, head_block(v, s, b, j), true, ds, 1.0f, 0.0f);
      for (int64_t t = 0; t < S; ++t) {
        const float* pr = p.row(t);
        float* dr = ds.row(t);
        float dot = 0.0f;
        for (int64_t c = 0; c <= t; ++c) dot += pr[c] * dr[c];
        for (int64_t c = 0; c <= t; ++c) dr[c] = pr[c] * (dr[c] - dot);
        std::fill(dr + t + 1, dr + S, 0.0f);
      }
      // scores = scale·q·kᵀ  ⇒  dq = scale·dS·k, dk = scale·dSᵀ·q.
      gemm(ds, false, head_block(k, s, b, j), false, head_block(dq, s, b, j), scale, 0.0f);
      gemm(ds, true, head_block(q, s, b, j), false, head_block(dk, s, b, j), scale, 0.0f);
    }
  }
}

}  // namespace coc
