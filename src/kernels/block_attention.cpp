// Block attention with positions and log-sum-exp (see coc/kernels/block_attention.h). Per (batch item, head), the
// queries go in tiles of kTileRows rows; each tile multiplies only the keys its last row may see (the causal
// prefix), so a block on the diagonal costs about half a full one, as in attention.cpp.
#include "coc/kernels/block_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/kernels/gemm.h"
#include "coc/runtime/tracer.h"
#include "dense_head.h"
#include "vec_math.h"

namespace coc {

namespace {

constexpr int64_t kTileRows = 128;  ///< the query tile of attention.cpp: bounded scratch, GEMMs large enough
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// The S×D block of (batch item b, head j) of a [S·B, heads·D] view.
template <typename T>
MatrixViewT<T> head_block(MatrixViewT<T> m, int64_t seq, int64_t batch, int64_t dim, int64_t b, int64_t j) {
  return {m.data + b * m.ld + j * dim, seq, dim, batch * m.ld};
}

/// Keys [0, n) are visible to the query at local row t (a prefix, since positions grow along the block).
int64_t visible_keys(const AttnBlock& g, int64_t t) {
  if (g.mask == AttnMask::kFull) return g.sk;
  return std::clamp<int64_t>(g.q_pos0 + t - g.k_pos0 + 1, 0, g.sk);
}

void check(const char* op, const AttnBlock& g, ConstMatrixView q, ConstMatrixView k, ConstMatrixView v) {
  COC_ASSERT(g.sq > 0 && g.sk > 0 && g.batch > 0 && g.heads > 0 && g.head_dim > 0,
             "{}: sq {}, sk {}, batch {}, heads {}, head_dim {}", op, g.sq, g.sk, g.batch, g.heads, g.head_dim);
  const int64_t c = g.heads * g.head_dim;
  COC_ASSERT(q.rows == g.sq * g.batch && q.cols == c, "{}: q [{}, {}] for sq {}, B {}, heads·D {}", op, q.rows, q.cols,
             g.sq, g.batch, c);
  COC_ASSERT(k.rows == g.sk * g.batch && k.cols == c && v.rows == k.rows && v.cols == c,
             "{}: k [{}, {}], v [{}, {}] for sk {}, B {}, heads·D {}", op, k.rows, k.cols, v.rows, v.cols, g.sk, g.batch,
             c);
}

template <typename T>
void check_like(const char* op, const char* name, MatrixViewT<T> m, ConstMatrixView ref) {
  COC_ASSERT(m.rows == ref.rows && m.cols == ref.cols, "{}: {} [{}, {}], expected [{}, {}]", op, name, m.rows, m.cols,
             ref.rows, ref.cols);
}

/// block_attention_forward's heads with products on T operands (float, or BFloat16 under --bf16: transformer_ops.h).
template <typename T>
void forward_heads(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, const AttnBlock& g, MatrixView out,
                   float* lse, const std::function<void()>& between_tiles, DType ct) {
  const int64_t B = g.batch, H = g.heads, D = g.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> scratch(static_cast<size_t>(std::min(kTileRows, g.sq) * g.sk));
  std::vector<T> pbuf;
  DenseHeadT<T> qd, kd, vd;  // each head's operands packed once, not once per tile (dense_head.h)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < H; ++j) {
      const MatrixViewT<const T> qh = qd.load(head_block(q, g.sq, B, D, b, j), 0, g.sq),
                                 kh = kd.load(head_block(k, g.sk, B, D, b, j), 0, g.sk),
                                 vh = vd.load(head_block(v, g.sk, B, D, b, j), 0, g.sk);
      const MatrixView oh = head_block(out, g.sq, B, D, b, j);
      for (int64_t t0 = 0; t0 < g.sq; t0 += kTileRows) {
        const int64_t rows = std::min(kTileRows, g.sq - t0);
        const int64_t nk = visible_keys(g, t0 + rows - 1);  // the widest row of the tile is its last
        if (nk == 0) {
          for (int64_t r = 0; r < rows; ++r) {
            std::fill(oh.row(t0 + r), oh.row(t0 + r) + D, 0.0f);
            lse[((t0 + r) * B + b) * H + j] = kNegInf;
          }
          continue;
        }
        MatrixView s{scratch.data(), rows, nk, nk};
        gemm(qh.slice_rows(t0, rows), false, kh.slice_rows(0, nk), true, s, scale, 0.0f);
        for (int64_t r = 0; r < rows; ++r) {
          float* row = s.row(r);
          const int64_t n = visible_keys(g, t0 + r);
          float& l = lse[((t0 + r) * B + b) * H + j];
          if (n == 0) {  // no visible key: a zero row gives out = 0, and lse −∞ says it holds no mass
            std::fill(row, row + nk, 0.0f);
            l = kNegInf;
            continue;
          }
          const float mx = detail::row_max(row, n);
          const float sum = detail::exp_shift_sum(row, n, mx);  // >= 1: the max term is e^0
          const float inv = 1.0f / sum;
          for (int64_t c = 0; c < n; ++c) row[c] *= inv;
          if (ct != DType::kF32) round_to_half(ct, row, n);
          std::fill(row + n, row + nk, 0.0f);
          l = mx + std::log(sum);
        }
        gemm(as_operand<T>(s, pbuf), false, vh.slice_rows(0, nk), false, oh.slice_rows(t0, rows), 1.0f, 0.0f);
        if (between_tiles) between_tiles();
      }
    }
  }
}

/// block_attention_backward's heads with products on T operands (float or BFloat16), as forward_heads.
template <typename T>
void backward_heads(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, ConstMatrixView out, const float* lse,
                    ConstMatrixView dout, const AttnBlock& g, MatrixView dq, MatrixView dk, MatrixView dv,
                    const std::function<void()>& between_tiles, DType ct) {
  const int64_t B = g.batch, H = g.heads, D = g.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const size_t tile = static_cast<size_t>(std::min(kTileRows, g.sq) * g.sk);
  std::vector<float> p_buf(tile), ds_buf(tile), delta(static_cast<size_t>(std::min(kTileRows, g.sq)));
  std::vector<T> p16, ds16;
  DenseHeadT<T> qd, kd, vd, dod;  // packed once per head
  DenseHead dqd, dkd, dvd;        // the gradients, read in and written back
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < H; ++j) {
      const MatrixViewT<const T> qh = qd.load(head_block(q, g.sq, B, D, b, j), 0, g.sq),
                                 kh = kd.load(head_block(k, g.sk, B, D, b, j), 0, g.sk),
                                 vh = vd.load(head_block(v, g.sk, B, D, b, j), 0, g.sk),
                                 doh = dod.load(head_block(dout, g.sq, B, D, b, j), 0, g.sq);
      const ConstMatrixView oh = head_block(out, g.sq, B, D, b, j), dof = head_block(dout, g.sq, B, D, b, j);
      const MatrixView dqh = dqd.load(head_block(dq, g.sq, B, D, b, j), 0, g.sq),
                       dkh = dkd.load(head_block(dk, g.sk, B, D, b, j), 0, g.sk),
                       dvh = dvd.load(head_block(dv, g.sk, B, D, b, j), 0, g.sk);
      for (int64_t t0 = 0; t0 < g.sq; t0 += kTileRows) {
        const int64_t rows = std::min(kTileRows, g.sq - t0);
        const int64_t nk = visible_keys(g, t0 + rows - 1);
        if (nk == 0) continue;
        // P = exp(scores − lse): this block's share of each row's full softmax (FlashAttention-2's recomputation).
        MatrixView p{p_buf.data(), rows, nk, nk};
        gemm(qh.slice_rows(t0, rows), false, kh.slice_rows(0, nk), true, p, scale, 0.0f);
        for (int64_t r = 0; r < rows; ++r) {
          float* row = p.row(r);
          const float l = lse[((t0 + r) * B + b) * H + j];
          const int64_t n = l == kNegInf ? 0 : visible_keys(g, t0 + r);
          for (int64_t c = 0; c < n; ++c) row[c] = detail::fast_exp(row[c] - l);
          if (ct != DType::kF32) round_to_half(ct, row, n);  // as the forward rounded it
          std::fill(row + n, row + nk, 0.0f);
          delta[static_cast<size_t>(r)] = n == 0 ? 0.0f : detail::row_dot(dof.row(t0 + r), oh.row(t0 + r), D);
        }
        const MatrixViewT<const T> dob = doh.slice_rows(t0, rows);
        gemm(as_operand<T>(p, p16), true, dob, false, dvh.slice_rows(0, nk), 1.0f, 1.0f);
        // dS = P ⊙ (dP − Δ) with dP = dO·vᵀ; masked entries have P = 0, so dS is 0 there.
        MatrixView ds{ds_buf.data(), rows, nk, nk};
        gemm(dob, false, vh.slice_rows(0, nk), true, ds, 1.0f, 0.0f);
        for (int64_t r = 0; r < rows; ++r) {
          const float* pr = p.row(r);
          float* dr = ds.row(r);
          const float dl = delta[static_cast<size_t>(r)];
          for (int64_t c = 0; c < nk; ++c) dr[c] = pr[c] * (dr[c] - dl);
        }
        const MatrixViewT<const T> dsv = as_operand<T>(ds, ds16);
        gemm(dsv, false, kh.slice_rows(0, nk), false, dqh.slice_rows(t0, rows), scale, 1.0f);
        gemm(dsv, true, qh.slice_rows(t0, rows), false, dkh.slice_rows(0, nk), scale, 1.0f);
        if (between_tiles) between_tiles();
      }
      dqd.store(head_block(dq, g.sq, B, D, b, j), 0, g.sq);
      dkd.store(head_block(dk, g.sk, B, D, b, j), 0, g.sk);
      dvd.store(head_block(dv, g.sk, B, D, b, j), 0, g.sk);
    }
  }
}

}  // namespace

const char* to_string(AttnMask m) { return m == AttnMask::kCausal ? "causal" : "general"; }

bool block_fully_masked(const AttnBlock& g) {
  return g.mask == AttnMask::kCausal && g.k_pos0 > g.q_pos0 + g.sq - 1;
}

void block_attention_forward(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, const AttnBlock& g,
                             MatrixView out, float* lse, const std::function<void()>& between_tiles) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "block_attention_forward", {"sq", g.sq}, {"sk", g.sk},
                  {"batch", g.batch}, {"heads", g.heads});
  check("block_attention_forward", g, q, k, v);
  check_like("block_attention_forward", "out", out, q);
  const DType ct = gemm_compute_type();  // kF32, or the 16-bit type the probabilities round to
  GemmComputeScope fp32(DType::kF32);  // fp32 operands stay fp32 (transformer_ops.h says which products are bf16)
  if (ct == DType::kBF16)
    forward_heads<BFloat16>(q, k, v, g, out, lse, between_tiles, ct);
  else
    forward_heads<float>(q, k, v, g, out, lse, between_tiles, ct);
}

void block_attention_backward(ConstMatrixView q, ConstMatrixView k, ConstMatrixView v, ConstMatrixView out,
                              const float* lse, ConstMatrixView dout, const AttnBlock& g, MatrixView dq, MatrixView dk,
                              MatrixView dv, const std::function<void()>& between_tiles) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "block_attention_backward", {"sq", g.sq},
                  {"sk", g.sk}, {"batch", g.batch}, {"heads", g.heads});
  const char* op = "block_attention_backward";
  check(op, g, q, k, v);
  check_like(op, "out", out, q);
  check_like(op, "dout", dout, q);
  check_like(op, "dq", dq, q);
  check_like(op, "dk", dk, k);
  check_like(op, "dv", dv, k);
  const DType ct = gemm_compute_type();  // kF32, or the 16-bit type the probabilities round to
  GemmComputeScope fp32(DType::kF32);
  if (ct == DType::kBF16)
    backward_heads<BFloat16>(q, k, v, out, lse, dout, g, dq, dk, dv, between_tiles, ct);
  else
    backward_heads<float>(q, k, v, out, lse, dout, g, dq, dk, dv, between_tiles, ct);
}

void attention_merge_partial(MatrixView acc, float* acc_lse, ConstMatrixView part, const float* part_lse,
                             int64_t heads, int64_t head_dim) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "attention_merge_partial", {"rows", acc.rows});
  COC_ASSERT(acc.cols == heads * head_dim && part.rows == acc.rows && part.cols == acc.cols,
             "attention_merge_partial: acc [{}, {}], part [{}, {}], heads {}, D {}", acc.rows, acc.cols, part.rows,
             part.cols, heads, head_dim);
  for (int64_t i = 0; i < acc.rows; ++i) {
    for (int64_t j = 0; j < heads; ++j) {
      const float pl = part_lse[i * heads + j];
      float& al = acc_lse[i * heads + j];
      if (pl == kNegInf) continue;  // nothing to add (and e^(−∞ − −∞) would be NaN)
      float* a = acc.row(i) + j * head_dim;
      const float* p = part.row(i) + j * head_dim;
      if (al == kNegInf) {
        std::copy(p, p + head_dim, a);
        al = pl;
        continue;
      }
      // log(e^a + e^p) = max + log1p(e^(−|a − p|)): no overflow, and exact when one side dominates.
      const float mx = std::max(al, pl);
      const float l = mx + std::log1p(std::exp(-std::fabs(al - pl)));
      const float wa = std::exp(al - l), wp = std::exp(pl - l);
      for (int64_t c = 0; c < head_dim; ++c) a[c] = a[c] * wa + p[c] * wp;
      al = l;
    }
  }
}

}  // namespace coc
