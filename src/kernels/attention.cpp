// Causal multi-head attention core, forward and backward, over per-(batch, head) strided views and GEMMs.
// Forward: scores = q·kᵀ/√D (Vaswani et al. 2017), causal mask, max-subtracted softmax, out = P·v.
// Backward follows llm.c's attention_backward, with its O(S²·D) loops replaced by GEMMs.
// Both walk the queries in blocks of kBlockRows rows and multiply each block only by the keys it may attend to
// (columns [0, block end)), as FlashAttention's causal variant skips blocks above the diagonal (Dao et al. 2022):
// for S >> 128 about half the FLOPs of full S×S products, and half the reads of the probabilities. At S = 1024,
// B = 4, 4 heads, D = 64 (configs/cluster-e2e.yaml per rank), with the vectorised softmax, forward + backward went
// from 270-315 ms to 125-135 ms on one Xeon core (docs/performance.md, point 13).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/kernels/gemm.h"
#include "coc/kernels/transformer_ops.h"
#include "coc/runtime/tracer.h"
#include "dense_head.h"
#include "vec_math.h"

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

void check_packed(const char* op, const AttentionBf16Heads* packed, const AttnShape& s) {
  if (!packed) return;
  COC_ASSERT(packed->q && packed->k && packed->v && packed->kv_heads > 0 && s.heads % packed->kv_heads == 0,
             "{}: packed bf16 operands with {} key/value heads for {} query heads", op, packed->kv_heads, s.heads);
}

/// The S×D block of (batch item b, head j): rows t·B + b for t in [0, S), columns [j·D, (j+1)·D).
template <typename T>
MatrixViewT<T> head_block(MatrixViewT<T> m, const AttnShape& s, int64_t b, int64_t j) {
  return {m.data + b * m.ld + j * s.dim, s.seq, s.dim, s.batch * m.ld};
}

/// Head (b, j)'s dense S×D block of a packed array (AttentionBf16Heads' layout) of `heads` heads.
MatrixViewT<const BFloat16> packed_head(const BFloat16* base, const AttnShape& s, int64_t b, int64_t j, int64_t heads) {
  return {base + (b * heads + j) * s.seq * s.dim, s.seq, s.dim, s.dim};
}

/// The operands of head (b, j): from `packed` where given (T = BFloat16), else rows [lo, hi) of q and [0, hi) of k,
/// v converted into the dense copies.
template <typename T>
struct HeadOperands {
  DenseHeadT<T> qd, kd, vd;
  MatrixViewT<const T> q, k, v;
  void load(ConstMatrixView qm, ConstMatrixView km, ConstMatrixView vm, const AttentionBf16Heads* packed,
            const AttnShape& s, int64_t b, int64_t j, int64_t lo, int64_t hi) {
    if constexpr (std::is_same_v<T, BFloat16>) {
      if (packed) {
        const int64_t g = j / (s.heads / packed->kv_heads);
        q = packed_head(packed->q, s, b, j, s.heads);
        k = packed_head(packed->k, s, b, g, packed->kv_heads);
        v = packed_head(packed->v, s, b, g, packed->kv_heads);
        return;
      }
    }
    q = qd.load(head_block(qm, s, b, j), lo, hi);
    k = kd.load(head_block(km, s, b, j), 0, hi);
    v = vd.load(head_block(vm, s, b, j), 0, hi);
  }
};

/// Where head bh keeps the probabilities of query block [t0, t0 + 128) (transformer_ops.h): at element
/// (bh·S + t0)·S of `probs` read as T, floats in fp32 and bf16 elements under --bf16.
template <typename T, typename P>
T* prob_block(P* probs, const AttnShape& s, int64_t bh, int64_t t0) {
  return reinterpret_cast<T*>(probs) + (bh * s.seq + t0) * s.seq;
}

/// Query rows per block. Small enough that the work above the diagonal (half a block per block: kBlockRows / S over
/// the exact triangle, 12.5% at S = 1024) stays small, large enough that each GEMM call is ~2-17 MFLOP at D = 64 and
/// OpenBLAS's packing is amortised.
constexpr int64_t kBlockRows = kAttentionBlockRows;

/// Row t (of an n-wide probability row, n > t) from its scores: columns [0, t] become the softmax over them,
/// columns (t, n) exact zeros. The helpers of vec_math.h keep the passes vectorised, with bits independent of the CPU.
COC_VEC_CLONES void softmax_causal_row(float* row, int64_t t, int64_t n) {
  // Subtracting the row max makes every exponent <= 0, so exp never overflows (stable softmax).
  const float mx = detail::row_max(row, t + 1);
  const float inv = 1.0f / detail::exp_shift_sum(row, t + 1, mx);  // sum >= 1 (the max term is exp(0))
  for (int64_t c = 0; c <= t; ++c) row[c] *= inv;
  std::fill(row + t + 1, row + n, 0.0f);  // causal mask: zeros so that P·v ignores the future
}

/// attention_forward_blocks' work on positions [lo, hi) with products on T operands (float or BFloat16). Under bf16
/// a query block's probabilities are kept in bf16 at the block's offset in `probs` (transformer_ops.h), so that the
/// context product and the backward read them with no conversion pass, and half the bytes.
template <typename T>
void forward_heads(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, const AttentionBf16Heads* packed,
                   const AttnShape& s, MatrixView out, float* probs, int64_t lo, int64_t hi, DType ct) {
  constexpr bool kBf16 = std::is_same_v<T, BFloat16>;
  const int64_t S = s.seq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.dim));
  HeadOperands<T> ops;
  std::vector<float> scores(kBf16 ? static_cast<size_t>(std::min(kBlockRows, S) * S) : 0);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t j = 0; j < s.heads; ++j) {
      ops.load(q, k, v, packed, s, b, j, lo, hi);
      const MatrixViewT<const T> qh = ops.q, kh = ops.k, vh = ops.v;
      const MatrixView oh = head_block(out, s, b, j);
      for (int64_t t0 = lo; t0 < hi; t0 += kBlockRows) {
        const int64_t rows = std::min(kBlockRows, S - t0), t1 = t0 + rows;
        // Scores of the block's queries against keys [0, t1); the keys past t1 are masked for every row here. In
        // fp32 they are computed where the block's probabilities are kept, so that P·v and the backward read them
        // without a copy; in bf16 in a scratch block, each row rounded into the kept bf16 block once normalised.
        T* blk = prob_block<T>(probs, s, b * s.heads + j, t0);
        MatrixView pb;
        if constexpr (kBf16)
          pb = {scores.data(), rows, t1, t1};
        else
          pb = {blk, rows, t1, t1};
        gemm(qh.slice_rows(t0, rows), false, kh.slice_rows(0, t1), true, pb, scale, 0.0f);
        for (int64_t r = 0; r < rows; ++r) {
          softmax_causal_row(pb.row(r), t0 + r, t1);
          if constexpr (kBf16)
            fp32_to_bf16(pb.row(r), blk + r * t1, t1);
          else if (ct != DType::kF32)
            round_to_half(ct, pb.row(r), t0 + r + 1);  // an fp16 model's probabilities
        }
        // The block's unused share: the same bits every run in fp32. The bf16 block's unused bytes are left as they
        // are: nothing reads them, and zeroing them took 2% of a bf16 step (perf, point 43).
        if constexpr (!kBf16) std::fill(blk + rows * t1, blk + rows * S, 0.0f);
        const MatrixViewT<const T> pv{blk, rows, t1, t1};
        gemm(pv, false, vh.slice_rows(0, t1), false, oh.slice_rows(t0, rows), 1.0f, 0.0f);
      }
    }
  }
}

/// The query positions [lo, hi) of one attention_backward_blocks call, walked from block `first` (the highest)
/// down; `last` is the sequence's last block, whose product initialises dk and dv.
struct BackwardRange {
  int64_t lo, hi, first, last;
};

/// attention_backward_blocks' work with products on T operands (float or BFloat16).
template <typename T>
void backward_heads(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, const AttentionBf16Heads* packed,
                    const float* probs, ConstMatrixView dout, const AttnShape& s, MatrixView dq, MatrixView dk,
                    MatrixView dv, const BackwardRange& range, float* dkv_heads) {
  constexpr bool kBf16 = std::is_same_v<T, BFloat16>;
  const int64_t S = s.seq, lo = range.lo, hi = range.hi;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.dim));
  const bool starts_at_last = range.first == range.last;
  const size_t block = static_cast<size_t>(std::min(kBlockRows, S) * S);
  std::vector<float> scratch(block), prow(static_cast<size_t>(S));
  std::vector<T> dsbuf(kBf16 ? block : 0);  // dS rounded: sized once, not per block
  HeadOperands<T> ops;
  DenseHeadT<T> dod;
  DenseHead dkd, dvd;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t j = 0; j < s.heads; ++j) {
      ops.load(q, k, v, packed, s, b, j, lo, hi);
      const MatrixViewT<const T> qh = ops.q, kh = ops.k, vh = ops.v,
                                 doh = dod.load(head_block(dout, s, b, j), lo, hi);
      const MatrixView dqh = head_block(dq, s, b, j);
      // dk, dv accumulate over the blocks in dense rows: the caller's across calls (dkv_heads), or copies read in
      // unless this call starts them and written back at the end.
      MatrixView dkh, dvh;
      if (dkv_heads) {
        dkh = {dkv_heads + (b * s.heads + j) * S * s.dim, S, s.dim, s.dim};
        dvh = {dkh.data + s.batch * s.heads * S * s.dim, S, s.dim, s.dim};
      } else {
        dkh = starts_at_last ? dkd.rows(S, s.dim) : dkd.load(head_block(dk, s, b, j), 0, hi);
        dvh = starts_at_last ? dvd.rows(S, s.dim) : dvd.load(head_block(dv, s, b, j), 0, hi);
      }
      for (int64_t t0 = range.first; t0 >= lo; t0 -= kBlockRows) {
        const int64_t rows = std::min(kBlockRows, S - t0), t1 = t0 + rows;
        const float beta = t0 == range.last ? 0.0f : 1.0f;
        const MatrixViewT<const T> pb{prob_block<const T>(probs, s, b * s.heads + j, t0), rows, t1, t1};  // forward's
        const MatrixViewT<const T> dob = doh.slice_rows(t0, rows);
        // dP = dO·vᵀ, then the softmax backward in place: dS = P ⊙ (dP − Σ_c P·dP). Masked entries have P = 0,
        // so dS is 0 there and the mask needs no separate gradient. In bf16 each row of P is widened into `prow`
        // and each row of dS rounded into the operand block as it is done, while both are in L1.
        MatrixView ds{scratch.data(), rows, t1, t1};
        gemm(dob, false, vh.slice_rows(0, t1), true, ds, 1.0f, 0.0f);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t t = t0 + r;
          const float* pr = prow.data();
          if constexpr (kBf16)
            bf16_to_fp32(pb.row(r), prow.data(), t + 1);
          else
            pr = pb.row(r);
          float* dr = ds.row(r);
          const float dot = detail::row_dot(pr, dr, t + 1);
          for (int64_t c = 0; c <= t; ++c) dr[c] = pr[c] * (dr[c] - dot);
          std::fill(dr + t + 1, dr + t1, 0.0f);
          if constexpr (kBf16) fp32_to_bf16(dr, dsbuf.data() + r * t1, t1);
        }
        // dv = Pᵀ·dO, once the rows above have brought P into cache: oneDNN copies a transposed operand column by
        // column, and from memory (the forward wrote P long before) it made this product 1.6x slower (point 55).
        gemm(pb, true, dob, false, dvh.slice_rows(0, t1), 1.0f, beta);
        // scores = scale·q·kᵀ  ⇒  dq = scale·dS·k, dk = scale·dSᵀ·q.
        MatrixViewT<const T> dsv;
        if constexpr (kBf16)
          dsv = {dsbuf.data(), rows, t1, t1};
        else
          dsv = ds;
        gemm(dsv, false, kh.slice_rows(0, t1), false, dqh.slice_rows(t0, rows), scale, 0.0f);
        gemm(dsv, true, qh.slice_rows(t0, rows), false, dkh.slice_rows(0, t1), scale, beta);
      }
      if (dkv_heads) {  // keys [lo, hi) have every query now (the later ones came in earlier calls)
        const MatrixView dko = head_block(dk, s, b, j), dvo = head_block(dv, s, b, j);
        for (int64_t t = lo; t < hi; ++t) {
          std::copy_n(dkh.row(t), s.dim, dko.row(t));
          std::copy_n(dvh.row(t), s.dim, dvo.row(t));
        }
      } else {
        dkd.store(head_block(dk, s, b, j), 0, hi);
        dvd.store(head_block(dv, s, b, j), 0, hi);
      }
    }
  }
}

}  // namespace

void attention_pack_heads_bf16(ConstMatrixView x, int64_t first_row, int64_t seq, int64_t batch, int64_t heads,
                               int64_t head_dim, BFloat16* dst) {
  COC_ASSERT(seq > 0 && batch > 0 && heads > 0 && head_dim > 0 && x.cols == heads * head_dim && first_row >= 0 &&
                 first_row + x.rows <= seq * batch,
             "attention_pack_heads_bf16: rows [{}, {}) of [{}, {}] for S {}, B {}, heads {}, D {}", first_row,
             first_row + x.rows, seq * batch, x.cols, seq, batch, heads, head_dim);
  // Row by row in memory order: each row t·B + b reads once, sequentially, and its heads go to their dense blocks.
  // (Walking each head's positions instead read 128-byte pieces B rows apart, every row once per head.)
  for (int64_t r = first_row; r < first_row + x.rows; ++r) {
    const int64_t t = r / batch, b = r % batch;
    fp32_to_bf16_rows(x.row(r - first_row), head_dim, dst + (b * heads * seq + t) * head_dim, seq * head_dim, heads,
                      head_dim);
  }
}

void attention_forward(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, int64_t batch, int64_t heads,
                       int64_t head_dim, MatrixView out, float* probs, const AttentionBf16Heads* packed) {
  const int64_t S = batch > 0 ? q.rows / batch : 0;
  attention_forward_blocks(q, k, v, batch, heads, head_dim, out, probs, 0, (S + kBlockRows - 1) / kBlockRows,
                           packed);
}

void attention_forward_blocks(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, int64_t batch, int64_t heads,
                              int64_t head_dim, MatrixView out, float* probs, int64_t first_block,
                              int64_t last_block, const AttentionBf16Heads* packed) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "attention_forward", {"rows", q.rows},
                  {"heads", heads}, {"first_block", first_block}, {"last_block", last_block});
  const AttnShape s = check_shape("attention_forward", q, batch, heads, head_dim);
  check_same("attention_forward", "k", k, q);
  check_same("attention_forward", "v", v, q);
  check_same("attention_forward", "out", out, q);
  const int64_t S = s.seq;
  COC_ASSERT(0 <= first_block && first_block <= last_block && (last_block - 1) * kBlockRows < std::max<int64_t>(S, 1),
             "attention_forward: blocks [{}, {}) of a sequence of {} positions ({} per block)", first_block, last_block,
             S, kBlockRows);
  const DType ct = gemm_compute_type();  // kF32, or the 16-bit type the probabilities round to
  GemmComputeScope fp32(DType::kF32);  // fp32 operands stay fp32 (transformer_ops.h says which products are bf16)
  const int64_t lo = first_block * kBlockRows, hi = std::min(S, last_block * kBlockRows);
  if (lo >= hi) return;
  if (ct == DType::kBF16) {
    check_packed("attention_forward", packed, s);
    forward_heads<BFloat16>(q, k, v, packed, s, out, probs, lo, hi, ct);
  } else {
    forward_heads<float>(q, k, v, nullptr, s, out, probs, lo, hi, ct);
  }
}

void attention_backward(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, const float* probs,
                        ConstMatrixView dout, int64_t batch, int64_t heads, int64_t head_dim, MatrixView dq,
                        MatrixView dk, MatrixView dv, const AttentionBf16Heads* packed) {
  const int64_t S = q.rows / std::max<int64_t>(batch, 1);
  attention_backward_blocks(q, k, v, probs, dout, batch, heads, head_dim, dq, dk, dv, 0,
                            (S + kBlockRows - 1) / kBlockRows, packed, nullptr);
}

void attention_backward_blocks(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, const float* probs,
                               ConstMatrixView dout, int64_t batch, int64_t heads, int64_t head_dim, MatrixView dq,
                               MatrixView dk, MatrixView dv, int64_t first_block, int64_t last_block,
                               const AttentionBf16Heads* packed, float* dkv_heads) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "attention_backward", {"rows", q.rows},
                  {"cols", q.cols}, {"first_block", first_block}, {"last_block", last_block});
  const AttnShape s = check_shape("attention_backward", q, batch, heads, head_dim);
  check_same("attention_backward", "k", k, q);
  check_same("attention_backward", "v", v, q);
  check_same("attention_backward", "dout", dout, q);
  check_same("attention_backward", "dq", dq, q);
  check_same("attention_backward", "dk", dk, q);
  check_same("attention_backward", "dv", dv, q);
  const int64_t S = s.seq;
  COC_ASSERT(0 <= first_block && first_block <= last_block && (last_block - 1) * kBlockRows < std::max<int64_t>(S, 1),
             "attention_backward: blocks [{}, {}) of a sequence of {} positions ({} per block)", first_block,
             last_block, S, kBlockRows);
  // dk and dv of key s collect every query t >= s, i.e. its own block and all later ones. Walking the blocks from
  // the last one, the last block's product covers every key and initialises dk, dv (beta 0); the earlier blocks
  // reach only keys [0, t1) and accumulate (beta 1). Each (batch item, head) is independent, so the heads may go
  // outermost here and the blocks across calls without changing any sum's order.
  const int64_t lo = first_block * kBlockRows, hi = std::min(S, last_block * kBlockRows);
  if (lo >= hi) return;
  const BackwardRange r{lo, hi, (last_block - 1) * kBlockRows, (S - 1) / kBlockRows * kBlockRows};
  const bool bf16 = gemm_compute_type() == DType::kBF16;
  GemmComputeScope fp32(DType::kF32);  // as the forward
  if (bf16) {
    check_packed("attention_backward", packed, s);
    backward_heads<BFloat16>(q, k, v, packed, probs, dout, s, dq, dk, dv, r, dkv_heads);
  } else {
    backward_heads<float>(q, k, v, nullptr, probs, dout, s, dq, dk, dv, r, dkv_heads);
  }
}

}  // namespace coc
