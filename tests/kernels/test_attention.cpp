// Causal attention forward (out and probs) against an fp64 reference; backward against central finite
// differences of that reference. q, k, v and dq, dk, dv are column slices of fused [S·B, 3·heads·D] matrices, so
// the strided (ld > cols) path is what is tested.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/kernels/gemm.h"
#include "coc/kernels/transformer_ops.h"
#include "kernel_test_util.h"

namespace coc {
namespace {

using test::expect_close;
using test::to_f64;

struct Shape {
  int64_t s, b, heads, d;
};

// fp64 reference. q, k, v row-major [S·B, heads·D]; returns out (same layout); probs [B, heads, S, S] if non-null.
std::vector<double> ref_attention(const std::vector<double>& q, const std::vector<double>& k,
                                  const std::vector<double>& v, const Shape& sh, std::vector<double>* probs) {
  const int64_t S = sh.s, B = sh.b, H = sh.heads, D = sh.d, C = H * D;
  std::vector<double> out(q.size(), 0.0);
  if (probs) probs->assign(static_cast<size_t>(B * H * S * S), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> p(static_cast<size_t>(S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < H; ++j)
      for (int64_t t = 0; t < S; ++t) {
        const int64_t qi = (t * B + b) * C + j * D;
        double mx = -INFINITY;
        for (int64_t s = 0; s <= t; ++s) {
          const int64_t ki = (s * B + b) * C + j * D;
          double acc = 0.0;
          for (int64_t c = 0; c < D; ++c) acc += q[qi + c] * k[ki + c];
          p[s] = acc * scale;
          mx = std::max(mx, p[s]);
        }
        double sum = 0.0;
        for (int64_t s = 0; s <= t; ++s) sum += (p[s] = std::exp(p[s] - mx));
        for (int64_t s = 0; s <= t; ++s) {
          p[s] /= sum;
          if (probs) (*probs)[((b * H + j) * S + t) * S + s] = p[s];
          const int64_t vi = (s * B + b) * C + j * D;
          for (int64_t c = 0; c < D; ++c) out[qi + c] += p[s] * v[vi + c];
        }
      }
  return out;
}

struct Fused {
  Tensor buf;
  MatrixView q, k, v;
  Fused(const Shape& sh, uint32_t seed, float amp) : buf({sh.s * sh.b, 3 * sh.heads * sh.d}) {
    test::fill_uniform(buf.mat(), seed, -amp, amp);
    const int64_t c = sh.heads * sh.d;
    q = buf.mat().slice_cols(0, c);
    k = buf.mat().slice_cols(c, c);
    v = buf.mat().slice_cols(2 * c, c);
  }
};

class Attention : public testing::TestWithParam<Shape> {};

// atol/rtol: the fp32 scores carry a relative rounding error of ~1e-7, i.e. an absolute one of ~1e-7·|score|
// inside exp(), so the tolerance on P grows with the score magnitude.
void check_forward(const Shape& sh, float amp, double p_atol) {
  Fused in(sh, 21, amp);
  const int64_t C = sh.heads * sh.d;
  Tensor out({sh.s * sh.b, C + 2});  // strided output too
  MatrixView o = out.mat().slice_cols(1, C);
  std::vector<float> probs(static_cast<size_t>(sh.b * sh.heads * sh.s * sh.s), -1.0f);
  attention_forward(in.q, in.k, in.v, sh.b, sh.heads, sh.d, o, probs.data());
  std::vector<double> pref;
  const auto oref = ref_attention(to_f64(in.q), to_f64(in.k), to_f64(in.v), sh, &pref);
  expect_close(o, oref, p_atol * amp, 1e-4, "out");
  std::vector<float> square(probs.size());  // [B, heads, S, S], the reference's layout
  for (int64_t bh = 0; bh < sh.b * sh.heads; ++bh)
    for (int64_t t = 0; t < sh.s; ++t)
      for (int64_t s = 0; s < sh.s; ++s)
        square[static_cast<size_t>((bh * sh.s + t) * sh.s + s)] = attention_prob(probs.data(), sh.s, bh, t, s);
  expect_close(square.data(), pref, p_atol, 1e-4, "probs");
  // The mask writes exact zeros, and each row is a distribution.
  for (int64_t bh = 0; bh < sh.b * sh.heads; ++bh)
    for (int64_t t = 0; t < sh.s; ++t) {
      double sum = 0.0;
      for (int64_t s = 0; s < sh.s; ++s) {
        const float pv = square[static_cast<size_t>((bh * sh.s + t) * sh.s + s)];
        if (s > t) {
          EXPECT_EQ(pv, 0.0f);
        }
        EXPECT_TRUE(std::isfinite(pv));
        sum += pv;
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
}

TEST_P(Attention, ForwardMatchesFp64) { check_forward(GetParam(), 1.0f, 1e-6); }

TEST_P(Attention, ForwardIsStableForLargeScores) {
  // Scores of order ±1e4: a softmax without max subtraction overflows exp() to inf and yields NaN.
  check_forward(GetParam(), 150.0f, 2e-2);
}

/// Inputs (seeds seed, seed + 1), the forward and the backward of one shape: dq, dk, dv are column slices of one
/// [S·B, 3·C] matrix pre-filled with 9 (every element must be overwritten).
struct BackwardRun {
  Fused in;
  Tensor dout, dqkv;
  int64_t C;
  BackwardRun(const Shape& sh, uint32_t seed)
      : in(sh, seed, 1.0f), dout({sh.s * sh.b, sh.heads * sh.d}), dqkv({sh.s * sh.b, 3 * sh.heads * sh.d}),
        C(sh.heads * sh.d) {
    test::fill_uniform(dout.mat(), seed + 1);
    Tensor out({sh.s * sh.b, C});
    std::vector<float> probs(static_cast<size_t>(sh.b * sh.heads * sh.s * sh.s));
    attention_forward(in.q, in.k, in.v, sh.b, sh.heads, sh.d, out.mat(), probs.data());
    dqkv.fill(9.0f);
    attention_backward(in.q, in.k, in.v, probs.data(), dout.mat(), sh.b, sh.heads, sh.d, grad(0), grad(1), grad(2));
  }
  /// 0: dq, 1: dk, 2: dv.
  MatrixView grad(int which) { return dqkv.mat().slice_cols(which * C, C); }
};

TEST_P(Attention, BackwardMatchesFiniteDifferences) {
  const Shape sh = GetParam();
  BackwardRun run(sh, 22);
  const Fused& in = run.in;
  MatrixView dq = run.grad(0), dk = run.grad(1), dv = run.grad(2);
  const auto qd = to_f64(in.q), kd = to_f64(in.k), vd = to_f64(in.v), dod = to_f64(run.dout.mat());
  const auto gq = test::fd_grad(
      [&](const std::vector<double>& x) { return test::dot(dod, ref_attention(x, kd, vd, sh, nullptr)); }, qd);
  const auto gk = test::fd_grad(
      [&](const std::vector<double>& x) { return test::dot(dod, ref_attention(qd, x, vd, sh, nullptr)); }, kd);
  const auto gv = test::fd_grad(
      [&](const std::vector<double>& x) { return test::dot(dod, ref_attention(qd, kd, x, sh, nullptr)); }, vd);
  expect_close(dq, gq, 1e-5, 1e-4, "dq");
  expect_close(dk, gk, 1e-5, 1e-4, "dk");
  expect_close(dv, gv, 1e-5, 1e-4, "dv");
}

INSTANTIATE_TEST_SUITE_P(Shapes, Attention,
                         testing::Values(Shape{5, 3, 2, 4}, Shape{1, 1, 1, 2}, Shape{1, 3, 2, 4}, Shape{5, 1, 2, 4},
                                         Shape{7, 2, 3, 3}, Shape{6, 1, 1, 1}),
                         [](const auto& info) {
                           const Shape& s = info.param;
                           return "S" + std::to_string(s.s) + "_B" + std::to_string(s.b) + "_H" +
                                  std::to_string(s.heads) + "_D" + std::to_string(s.d);
                         });

// Sequences longer than the kernels' 128-row query blocks: several blocks, a partial last one (S = 300, 129, 200),
// an exact multiple (256), batch and heads together (200 × 3 × 2), and rows long enough for the vectorised softmax
// passes. Backward is checked along random directions (a central difference of ⟨dout, attention(x + h·u)⟩ in fp64
// against ⟨dx, u⟩): a full finite-difference gradient would cost one reference forward per input element.
class AttentionBlocks : public testing::TestWithParam<Shape> {};

TEST_P(AttentionBlocks, ForwardMatchesFp64) { check_forward(GetParam(), 1.0f, 1e-6); }

TEST_P(AttentionBlocks, ForwardIsStableForLargeScores) { check_forward(GetParam(), 150.0f, 2e-2); }

TEST_P(AttentionBlocks, BackwardMatchesDirectionalDerivatives) {
  const Shape sh = GetParam();
  const int64_t C = sh.heads * sh.d, M = sh.s * sh.b;
  BackwardRun run(sh, 25);
  const std::vector<double> dod = to_f64(run.dout.mat());
  std::vector<std::vector<double>> x = {to_f64(run.in.q), to_f64(run.in.k), to_f64(run.in.v)};
  const char* names[3] = {"dq", "dk", "dv"};
  for (int which = 0; which < 3; ++which) {
    Tensor dir({M, C});
    test::fill_uniform(dir.mat(), 30 + static_cast<uint32_t>(which));
    const std::vector<double> u = to_f64(dir.mat());
    const std::vector<double> g = to_f64(run.grad(which));
    const double h = 1e-4;
    auto loss_at = [&](double step) {
      std::vector<std::vector<double>> xs = x;
      for (size_t i = 0; i < u.size(); ++i) xs[static_cast<size_t>(which)][i] += step * u[i];
      return test::dot(dod, ref_attention(xs[0], xs[1], xs[2], sh, nullptr));
    };
    const double fd = (loss_at(h) - loss_at(-h)) / (2 * h);
    const double analytic = test::dot(g, u);
    EXPECT_NEAR(analytic, fd, 1e-4 * (1.0 + std::abs(fd))) << names[which];
  }
}

// attention_forward_blocks: any grouping of the query blocks, in any order, writes attention_forward's bits and
// leaves the rows of other blocks alone (the decoder's --attention-dense-pipeline relies on both).
TEST_P(AttentionBlocks, BlocksInAnyGroupingGiveTheWholeCallsBits) {
  const Shape sh = GetParam();
  const int64_t C = sh.heads * sh.d, M = sh.s * sh.b, nb = (sh.s + kAttentionBlockRows - 1) / kAttentionBlockRows;
  Fused in(sh, 27, 1.0f);
  const size_t np = static_cast<size_t>(sh.b * sh.heads * sh.s * sh.s);
  Tensor whole({M, C});
  std::vector<float> pw(np);
  attention_forward(in.q, in.k, in.v, sh.b, sh.heads, sh.d, whole.mat(), pw.data());
  Tensor parts({M, C});
  parts.fill(-3.0f);
  std::vector<float> pp(np, -3.0f);
  // The last block alone first (the others' rows of out and probs must stay untouched), then the one before it,
  // then the rest in one call.
  attention_forward_blocks(in.q, in.k, in.v, sh.b, sh.heads, sh.d, parts.mat(), pp.data(), nb - 1, nb);
  const int64_t t_last = (nb - 1) * kAttentionBlockRows;  // first position of the last block
  for (int64_t i = 0; i < t_last * sh.b * C; ++i)
    ASSERT_EQ(parts.data()[i], -3.0f) << "out row " << i / C << " written early";
  for (int64_t bh = 0; bh < sh.b * sh.heads; ++bh)
    for (int64_t i = 0; i < t_last * sh.s; ++i)
      ASSERT_EQ(pp[static_cast<size_t>(bh * sh.s * sh.s + i)], -3.0f) << "probs row " << i / sh.s << " written early";
  if (nb >= 2)
    attention_forward_blocks(in.q, in.k, in.v, sh.b, sh.heads, sh.d, parts.mat(), pp.data(), nb - 2, nb - 1);
  if (nb >= 3)
    attention_forward_blocks(in.q, in.k, in.v, sh.b, sh.heads, sh.d, parts.mat(), pp.data(), 0, nb - 2);
  attention_forward_blocks(in.q, in.k, in.v, sh.b, sh.heads, sh.d, parts.mat(), pp.data(), 0, 0);  // empty: no-op
  EXPECT_EQ(std::memcmp(whole.data(), parts.data(), static_cast<size_t>(M * C) * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(pw.data(), pp.data(), np * sizeof(float)), 0);
}

// attention_backward_blocks: the blocks from the last one down, in any grouping, give attention_backward's bits,
// and a call writes only its blocks' rows of dq (the decoder's --attention-dense-backward-pipeline runs them as
// the projection's backward hands out their rows of dout).
TEST_P(AttentionBlocks, BackwardBlocksFromTheLastDownGiveTheWholeCallsBits) {
  const Shape sh = GetParam();
  const int64_t C = sh.heads * sh.d, M = sh.s * sh.b, nb = (sh.s + kAttentionBlockRows - 1) / kAttentionBlockRows;
  Fused in(sh, 28, 1.0f);
  std::vector<float> probs(static_cast<size_t>(sh.b * sh.heads * sh.s * sh.s));
  Tensor out({M, C}), dout({M, C});
  attention_forward(in.q, in.k, in.v, sh.b, sh.heads, sh.d, out.mat(), probs.data());
  test::fill_uniform(dout.mat(), 29, -1.0f, 1.0f);
  Tensor whole({M, 3 * C});
  MatrixView w = whole.mat();
  attention_backward(in.q, in.k, in.v, probs.data(), dout.mat(), sh.b, sh.heads, sh.d, w.slice_cols(0, C),
                     w.slice_cols(C, C), w.slice_cols(2 * C, C));
  // Groupings: one block per call; the last block alone, then the rest in one call; all in one call. Each with dK
  // and dV read back between the calls, and kept in the caller's dense accumulator (dkv_heads).
  for (int grouping = 0; grouping < 6; ++grouping) {
    const bool acc = grouping >= 3;
    SCOPED_TRACE("grouping " + std::to_string(grouping % 3) + (acc ? ", accumulator" : ""));
    Tensor parts({M, 3 * C}), dkv({2 * M, C});
    parts.fill(-3.0f);
    dkv.fill(7.0f);  // the first call must overwrite it
    MatrixView p = parts.mat();
    auto run = [&](int64_t first, int64_t last) {
      attention_backward_blocks(in.q, in.k, in.v, probs.data(), dout.mat(), sh.b, sh.heads, sh.d,
                                p.slice_cols(0, C), p.slice_cols(C, C), p.slice_cols(2 * C, C), first, last, nullptr,
                                acc ? dkv.data() : nullptr);
    };
    if (grouping % 3 == 0) {
      for (int64_t q = nb - 1; q >= 0; --q) {
        run(q, q + 1);
        // dq rows of the blocks not yet run are untouched; dk and dv rows of the blocks run are final.
        const int64_t done = q * kAttentionBlockRows * sh.b;
        for (int64_t i = 0; i < done; ++i)
          for (int64_t c = 0; c < C; ++c) ASSERT_EQ(p.row(i)[c], -3.0f) << "dq row " << i << " written early";
        for (int64_t i = done; i < M; ++i)
          ASSERT_EQ(std::memcmp(w.row(i) + C, p.row(i) + C, static_cast<size_t>(2 * C) * sizeof(float)), 0)
              << "dk, dv row " << i << " not final after block " << q;
      }
    } else if (grouping % 3 == 1) {
      run(nb - 1, nb);
      run(0, nb - 1);
      run(0, 0);  // empty: a no-op
    } else {
      run(0, nb);
    }
    for (int64_t i = 0; i < M; ++i)
      ASSERT_EQ(std::memcmp(w.row(i), p.row(i), static_cast<size_t>(3 * C) * sizeof(float)), 0) << "row " << i;
  }
}

// --bf16 (transformer_ops.h): the products run on bf16 kernels. Inputs hold bf16 values, as the layers pass them.
bool has_bf16_gemms() { return !onednn_info().bf16_kernel.empty(); }

void round_all(Tensor& t) { round_to_bf16(t.data(), t.numel()); }

// Forward against fp64 of the same (bf16-valued) inputs. Scores: products of bf16 values are exact in fp32 and
// their sums over D round by at most D·2^-24 relative, so P is the fp64 softmax up to ~1e-6 before it is rounded
// to bf16 (relative error ≤ u = 2^-8). out = Σ_s P̃·v: |Δout| ≤ u·Σ_s P·|v| ≤ u·max|v| = u here (|v| ≤ 1, ΣP = 1),
// plus fp32 sums over ≤ S terms (S·2^-24 ≈ 2e-5). So P within u relative + 1e-6, out within u + 2e-5.
TEST_P(AttentionBlocks, Bf16ForwardMatchesFp64WithinTheRounding) {
  if (!has_bf16_gemms()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  const Shape sh = GetParam();
  Fused in(sh, 31, 1.0f);
  round_all(in.buf);
  const int64_t C = sh.heads * sh.d;
  Tensor out({sh.s * sh.b, C});
  // bf16 probabilities take half the floats of fp32's (attention_prob_floats): the rest must stay as it was.
  const size_t used = static_cast<size_t>(attention_prob_floats(sh.b, sh.heads, sh.s, DType::kBF16));
  std::vector<float> probs(static_cast<size_t>(sh.b * sh.heads * sh.s * sh.s) + 1, -7.0f);
  {
    GemmComputeScope bf16(DType::kBF16);
    attention_forward(in.q, in.k, in.v, sh.b, sh.heads, sh.d, out.mat(), probs.data());
  }
  for (size_t i = used; i < probs.size(); ++i) ASSERT_EQ(probs[i], -7.0f) << "float " << i << " of " << used;
  std::vector<double> pref;
  const auto oref = ref_attention(to_f64(in.q), to_f64(in.k), to_f64(in.v), sh, &pref);
  const double u = std::ldexp(1.0, -8);
  expect_close(out.mat(), oref, u + 2e-5, 0.0, "out");
  std::vector<float> square(probs.size());
  for (int64_t bh = 0; bh < sh.b * sh.heads; ++bh)
    for (int64_t t = 0; t < sh.s; ++t)
      for (int64_t s = 0; s < sh.s; ++s)
        square[static_cast<size_t>((bh * sh.s + t) * sh.s + s)] =
            attention_prob(probs.data(), sh.s, bh, t, s, DType::kBF16);
  expect_close(square.data(), pref, 1e-6, u, "probs");
}

// Backward on bf16 kernels against the fp32 kernels on the same inputs (bf16 values, dO too). What differs: P̃ and
// dS are rounded to bf16 before their products (relative ≤ u each), and dS = P̃ ⊙ (dP − Σ P̃·dP) inherits P̃'s
// rounding once more through the row sum. Every gradient element is a sum of products with one such factor, so
// its error is at most ~3u times the sum of the terms' magnitudes; norm-wise ≤ 3u·‖g‖ for these inputs, checked
// at 4u.
TEST_P(AttentionBlocks, Bf16BackwardStaysWithinTheRoundingOfFp32s) {
  if (!has_bf16_gemms()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  const Shape sh = GetParam();
  const int64_t C = sh.heads * sh.d, M = sh.s * sh.b;
  Fused in(sh, 32, 1.0f);
  round_all(in.buf);
  Tensor dout({M, C});
  test::fill_uniform(dout.mat(), 33, -1.0f, 1.0f);
  round_all(dout);
  Tensor g[2] = {Tensor({M, 3 * C}), Tensor({M, 3 * C})};
  for (int i = 0; i < 2; ++i) {
    const DType ct = i == 0 ? DType::kF32 : DType::kBF16;
    GemmComputeScope type(ct);
    std::vector<float> probs(static_cast<size_t>(attention_prob_floats(sh.b, sh.heads, sh.s, ct)));
    Tensor out({M, C});
    attention_forward(in.q, in.k, in.v, sh.b, sh.heads, sh.d, out.mat(), probs.data());
    if (i == 0) round_to_bf16(probs.data(), static_cast<int64_t>(probs.size()));  // the probabilities bf16 keeps
    MatrixView w = g[i].mat();
    attention_backward(in.q, in.k, in.v, probs.data(), dout.mat(), sh.b, sh.heads, sh.d, w.slice_cols(0, C),
                       w.slice_cols(C, C), w.slice_cols(2 * C, C));
  }
  const char* names[3] = {"dq", "dk", "dv"};
  for (int which = 0; which < 3; ++which) {
    double diff = 0, norm = 0;
    for (int64_t r = 0; r < M; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const double a = g[0].mat().row(r)[which * C + c], b = g[1].mat().row(r)[which * C + c];
        diff += (a - b) * (a - b);
        norm += a * a;
      }
    EXPECT_LE(std::sqrt(diff), 4 * std::ldexp(1.0, -8) * std::sqrt(norm)) << names[which];
    if (which == 0) EXPECT_GT(diff, 0.0) << "dq: the bf16 kernels did not run (dS is rounded only there)";
  }
}

// The bits the pipelines rely on hold on the bf16 kernels too: any grouping of the blocks gives the whole call's.
TEST_P(AttentionBlocks, Bf16BlocksInAnyGroupingGiveTheWholeCallsBits) {
  if (!has_bf16_gemms()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  const Shape sh = GetParam();
  const int64_t C = sh.heads * sh.d, M = sh.s * sh.b, nb = (sh.s + kAttentionBlockRows - 1) / kAttentionBlockRows;
  GemmComputeScope bf16(DType::kBF16);
  Fused in(sh, 34, 1.0f);
  round_all(in.buf);
  const size_t np = static_cast<size_t>(sh.b * sh.heads * sh.s * sh.s);
  std::vector<float> pw(np), pp(np);
  Tensor whole({M, C}), parts({M, C}), dout({M, C}), gw({M, 3 * C}), gp({M, 3 * C});
  attention_forward(in.q, in.k, in.v, sh.b, sh.heads, sh.d, whole.mat(), pw.data());
  for (int64_t q = nb - 1; q >= 0; --q)
    attention_forward_blocks(in.q, in.k, in.v, sh.b, sh.heads, sh.d, parts.mat(), pp.data(), q, q + 1);
  EXPECT_EQ(std::memcmp(whole.data(), parts.data(), static_cast<size_t>(M * C) * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(pw.data(), pp.data(), np * sizeof(float)), 0);
  test::fill_uniform(dout.mat(), 35, -1.0f, 1.0f);
  MatrixView a = gw.mat(), b = gp.mat();
  attention_backward(in.q, in.k, in.v, pw.data(), dout.mat(), sh.b, sh.heads, sh.d, a.slice_cols(0, C),
                     a.slice_cols(C, C), a.slice_cols(2 * C, C));
  for (int64_t q = nb - 1; q >= 0; --q)
    attention_backward_blocks(in.q, in.k, in.v, pw.data(), dout.mat(), sh.b, sh.heads, sh.d, b.slice_cols(0, C),
                              b.slice_cols(C, C), b.slice_cols(2 * C, C), q, q + 1);
  EXPECT_EQ(std::memcmp(gw.data(), gp.data(), static_cast<size_t>(M * 3 * C) * sizeof(float)), 0);
}

// attention_pack_heads_bf16 in chunks of rows that split positions and batch items (7 rows at B = 2 or 3) writes
// head (b, j)'s position t at ((b·heads + j)·S + t)·D, and the kernels reading the packed operands give the bits
// of those converting q, k, v themselves; with grouped-query attention too (one key/value head for two query
// heads, the views holding the repeated heads as the decoder passes them).
TEST_P(AttentionBlocks, Bf16PackedOperandsGiveTheConvertingKernelsBits) {
  if (!has_bf16_gemms()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  const Shape sh = GetParam();
  const int64_t C = sh.heads * sh.d, M = sh.s * sh.b, nb = (sh.s + kAttentionBlockRows - 1) / kAttentionBlockRows;
  const int64_t groups = sh.heads % 2 == 0 ? sh.heads / 2 : sh.heads, per = sh.heads / groups;
  GemmComputeScope bf16(DType::kBF16);
  Fused in(sh, 36, 1.0f);
  round_all(in.buf);
  // k and v per group (the first heads' values), then repeated into the views: head j holds group j / per.
  Tensor kg({M, groups * sh.d}), vg({M, groups * sh.d});
  copy(in.k.slice_cols(0, groups * sh.d), kg.mat());
  copy(in.v.slice_cols(0, groups * sh.d), vg.mat());
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < sh.heads; ++j) {
      std::copy(kg.mat().row(i) + (j / per) * sh.d, kg.mat().row(i) + (j / per + 1) * sh.d, in.k.row(i) + j * sh.d);
      std::copy(vg.mat().row(i) + (j / per) * sh.d, vg.mat().row(i) + (j / per + 1) * sh.d, in.v.row(i) + j * sh.d);
    }
  const int64_t n = M * sh.d;  // one head's elements
  std::vector<BFloat16> packed(static_cast<size_t>((sh.heads + 2 * groups) * n));
  for (int64_t r0 = 0; r0 < M; r0 += 7) {
    const int64_t rows = std::min<int64_t>(7, M - r0);
    attention_pack_heads_bf16(in.q.slice_rows(r0, rows), r0, sh.s, sh.b, sh.heads, sh.d, packed.data());
    attention_pack_heads_bf16(kg.mat().slice_rows(r0, rows), r0, sh.s, sh.b, groups, sh.d,
                              packed.data() + sh.heads * n);
    attention_pack_heads_bf16(vg.mat().slice_rows(r0, rows), r0, sh.s, sh.b, groups, sh.d,
                              packed.data() + (sh.heads + groups) * n);
  }
  for (int64_t b = 0; b < sh.b; ++b)
    for (int64_t j = 0; j < sh.heads; ++j)
      for (int64_t t = 0; t < sh.s; ++t)
        for (int64_t c = 0; c < sh.d; ++c)
          ASSERT_EQ(bf16_to_float(packed[static_cast<size_t>(((b * sh.heads + j) * sh.s + t) * sh.d + c)]),
                    in.q.row(t * sh.b + b)[j * sh.d + c])
              << "q of b " << b << ", head " << j << ", t " << t;
  const AttentionBf16Heads heads{.q = packed.data(), .k = packed.data() + sh.heads * n,
                                 .v = packed.data() + (sh.heads + groups) * n, .kv_heads = groups};
  const size_t np = static_cast<size_t>(sh.b * sh.heads * sh.s * sh.s);
  std::vector<float> pw(np), pp(np);
  Tensor plain({M, C}), fromp({M, C}), dout({M, C}), gw({M, 3 * C}), gp({M, 3 * C});
  attention_forward(in.q, in.k, in.v, sh.b, sh.heads, sh.d, plain.mat(), pw.data());
  for (int64_t q = 0; q < nb; ++q)
    attention_forward_blocks(in.q, in.k, in.v, sh.b, sh.heads, sh.d, fromp.mat(), pp.data(), q, q + 1, &heads);
  EXPECT_EQ(std::memcmp(plain.data(), fromp.data(), static_cast<size_t>(M * C) * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(pw.data(), pp.data(), np * sizeof(float)), 0);
  test::fill_uniform(dout.mat(), 37, -1.0f, 1.0f);
  MatrixView a = gw.mat(), b = gp.mat();
  attention_backward(in.q, in.k, in.v, pw.data(), dout.mat(), sh.b, sh.heads, sh.d, a.slice_cols(0, C),
                     a.slice_cols(C, C), a.slice_cols(2 * C, C));
  for (int64_t q = nb - 1; q >= 0; --q)
    attention_backward_blocks(in.q, in.k, in.v, pw.data(), dout.mat(), sh.b, sh.heads, sh.d, b.slice_cols(0, C),
                              b.slice_cols(C, C), b.slice_cols(2 * C, C), q, q + 1, &heads);
  EXPECT_EQ(std::memcmp(gw.data(), gp.data(), static_cast<size_t>(M * 3 * C) * sizeof(float)), 0);
  // The kernels read the packed operands, not the views: zero values there give a zero output.
  std::fill(packed.begin(), packed.end(), BFloat16{});
  attention_forward(in.q, in.k, in.v, sh.b, sh.heads, sh.d, fromp.mat(), pp.data(), &heads);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(fromp.mat().row(i)[c], 0.0f);
}

TEST(AttentionPack, RowsPastTheSequenceAreRefused) {
  Tensor x({5, 4});
  std::vector<BFloat16> dst(64);
  EXPECT_THROW(attention_pack_heads_bf16(x.mat(), 2, 3, 2, 2, 2, dst.data()), Error);  // rows [2, 7) of S·B = 6
  EXPECT_THROW(attention_pack_heads_bf16(x.mat(), 0, 3, 2, 1, 2, dst.data()), Error);  // 4 columns for 1 head of D 2
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionBlocks,
                         testing::Values(Shape{300, 1, 2, 4}, Shape{129, 2, 1, 8}, Shape{256, 1, 1, 2},
                                         Shape{200, 3, 2, 4}),
                         [](const auto& info) {
                           const Shape& s = info.param;
                           return "S" + std::to_string(s.s) + "_B" + std::to_string(s.b) + "_H" +
                                  std::to_string(s.heads) + "_D" + std::to_string(s.d);
                         });

TEST(AttentionSingle, FirstPositionCopiesV) {
  // Position 0 sees only itself: out row 0 equals v row 0 for every head, and P[0][0] = 1.
  const Shape sh{4, 2, 2, 3};
  Fused in(sh, 24, 1.0f);
  Tensor out({8, 6});
  std::vector<float> probs(static_cast<size_t>(2 * 2 * 16));
  attention_forward(in.q, in.k, in.v, 2, 2, 3, out.mat(), probs.data());
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 0; c < 6; ++c) EXPECT_FLOAT_EQ(out.mat().row(b)[c], in.v.row(b)[c]);
  for (int64_t bh = 0; bh < 4; ++bh) EXPECT_EQ(probs[static_cast<size_t>(bh * 16)], 1.0f);
}

}  // namespace
}  // namespace coc
