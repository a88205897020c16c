// Block attention (coc/kernels/block_attention.h) against an fp64 reference with explicit positions: one block
// alone (output, lse, FlashAttention-2 gradients), the keys split into blocks whose partials merge by lse to the
// full attention (forward and backward), fully masked rows (lse −∞, no NaN), and the merge's −∞ cases.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "coc/core/bf16.h"
#include "coc/kernels/block_attention.h"
#include "coc/kernels/gemm.h"
#include "kernel_test_util.h"

namespace coc {
namespace {

using test::expect_close;
using test::to_f64;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Ref {
  std::vector<double> out, lse, dq, dk, dv;
};

/// fp64 attention of queries at positions qpos against keys at kpos (mask by position), row layouts as the kernel;
/// gradients for dout.
Ref reference(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
              const std::vector<double>& dout, const std::vector<int64_t>& qpos, const std::vector<int64_t>& kpos,
              int64_t B, int64_t H, int64_t D, AttnMask mask) {
  const int64_t sq = static_cast<int64_t>(qpos.size()), sk = static_cast<int64_t>(kpos.size()), C = H * D;
  Ref r;
  r.out.assign(q.size(), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  r.lse.assign(static_cast<size_t>(sq * B * H), -kInf);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> p(static_cast<size_t>(sk)), dp(static_cast<size_t>(sk));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < H; ++j)
      for (int64_t t = 0; t < sq; ++t) {
        const int64_t qi = (t * B + b) * C + j * D;
        double mx = -kInf;
        for (int64_t s = 0; s < sk; ++s) {
          const bool vis = mask == AttnMask::kFull || kpos[s] <= qpos[t];
          double acc = 0.0;
          for (int64_t c = 0; c < D; ++c) acc += q[qi + c] * k[(s * B + b) * C + j * D + c];
          p[s] = vis ? acc * scale : -kInf;
          mx = std::max(mx, p[s]);
        }
        if (mx == -kInf) continue;  // no visible key: out 0, lse −∞, no gradient
        double sum = 0.0;
        for (int64_t s = 0; s < sk; ++s) sum += std::exp(p[s] - mx);
        r.lse[(t * B + b) * H + j] = mx + std::log(sum);
        double dot = 0.0;
        for (int64_t s = 0; s < sk; ++s) {
          p[s] = std::exp(p[s] - mx) / sum;
          const int64_t vi = (s * B + b) * C + j * D;
          double d = 0.0;
          for (int64_t c = 0; c < D; ++c) {
            r.out[qi + c] += p[s] * v[vi + c];
            d += dout[qi + c] * v[vi + c];
            r.dv[vi + c] += p[s] * dout[qi + c];
          }
          dp[s] = d;
          dot += p[s] * d;
        }
        for (int64_t s = 0; s < sk; ++s) {
          const double ds = p[s] * (dp[s] - dot) * scale;
          const int64_t ki = (s * B + b) * C + j * D;
          for (int64_t c = 0; c < D; ++c) {
            r.dq[qi + c] += ds * k[ki + c];
            r.dk[ki + c] += ds * q[qi + c];
          }
        }
      }
  return r;
}

std::vector<int64_t> iota(int64_t n, int64_t from) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = from + i;
  return v;
}

void expect_lse(const std::vector<float>& got, const std::vector<double>& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (ref[i] == -kInf) {
      EXPECT_EQ(got[i], -std::numeric_limits<float>::infinity()) << what << " row " << i;
    } else {
      EXPECT_NEAR(got[i], ref[i], 1e-5 * (1 + std::fabs(ref[i]))) << what << " row " << i;
    }
  }
}

void expect_finite(ConstMatrixView m, const std::string& what) {
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t c = 0; c < m.cols; ++c) ASSERT_TRUE(std::isfinite(m.row(i)[c])) << what << " (" << i << ", " << c << ")";
}

struct Case {
  int64_t sq, sk, B, H, D, q_pos0, k_pos0;
  AttnMask mask;
};

/// One block alone: its output, lse and gradients equal attention over just its keys.
void run_single(const Case& cs) {
  SCOPED_TRACE(testing::Message() << "sq " << cs.sq << " sk " << cs.sk << " B " << cs.B << " H " << cs.H << " D "
                                  << cs.D << " q_pos0 " << cs.q_pos0 << " k_pos0 " << cs.k_pos0 << " "
                                  << to_string(cs.mask));
  const int64_t C = cs.H * cs.D;
  // q as a column slice of a wider matrix: the strided path.
  Tensor qbuf({cs.sq * cs.B, C + 3}), k({cs.sk * cs.B, C}), v({cs.sk * cs.B, C}), dout({cs.sq * cs.B, C});
  test::fill_uniform(qbuf.mat(), 1, -2, 2);
  test::fill_uniform(k.mat(), 2, -2, 2);
  test::fill_uniform(v.mat(), 3);
  test::fill_uniform(dout.mat(), 4);
  const ConstMatrixView q = qbuf.mat().slice_cols(3, C);
  const AttnBlock g{cs.sq, cs.sk, cs.B, cs.H, cs.D, cs.q_pos0, cs.k_pos0, cs.mask};
  Tensor out({cs.sq * cs.B, C});
  std::vector<float> lse(static_cast<size_t>(cs.sq * cs.B * cs.H));
  block_attention_forward(q, k.mat(), v.mat(), g, out.mat(), lse.data());
  const Ref r = reference(to_f64(q), to_f64(k.mat()), to_f64(v.mat()), to_f64(dout.mat()), iota(cs.sq, cs.q_pos0),
                          iota(cs.sk, cs.k_pos0), cs.B, cs.H, cs.D, cs.mask);
  expect_finite(out.mat(), "out");
  expect_close(out.mat(), r.out, 1e-6, 1e-5, "out");
  expect_lse(lse, r.lse, "lse");
  Tensor dq({cs.sq * cs.B, C}), dk({cs.sk * cs.B, C}), dv({cs.sk * cs.B, C});
  block_attention_backward(q, k.mat(), v.mat(), out.mat(), lse.data(), dout.mat(), g, dq.mat(), dk.mat(), dv.mat());
  expect_finite(dq.mat(), "dq");
  expect_close(dq.mat(), r.dq, 1e-5, 1e-4, "dq");
  expect_close(dk.mat(), r.dk, 1e-5, 1e-4, "dk");
  expect_close(dv.mat(), r.dv, 1e-5, 1e-4, "dv");
}

TEST(BlockAttention, OneBlockMatchesReference) {
  for (AttnMask m : {AttnMask::kCausal, AttnMask::kFull}) {
    run_single({7, 7, 1, 1, 4, 0, 0, m});         // the diagonal block
    run_single({5, 9, 3, 2, 6, 10, 3, m});        // keys partly before, partly after the queries
    run_single({13, 6, 2, 3, 8, 20, 0, m});       // every key in the past
    run_single({150, 140, 2, 2, 4, 100, 90, m});  // more than one 128-row tile
  }
}

// --bf16: the products run on bf16 kernels (transformer_ops.h); the inputs hold bf16 values, as the layers pass them.
// Forward against fp64 of those inputs: the scores' products are exact in fp32, so P is the fp64 softmax up to
// ~1e-6 before its rounding to bf16 (relative ≤ u = 2^-8), and |Δout| ≤ u·Σ P·|v| ≤ u·max|v| (= u) plus fp32 sums;
// lse comes from the fp32 scores, as in fp32. Backward against the fp32 kernels on the same inputs: each gradient
// term has one factor (P or dS) rounded once or twice, so norm-wise ≤ 3u·‖g‖, checked at 4u; and dq differs at all
// (the bf16 kernels ran: dS is rounded only there).
TEST(BlockAttention, Bf16WithinTheRounding) {
  if (onednn_info().bf16_kernel.empty()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  for (AttnMask m : {AttnMask::kCausal, AttnMask::kFull}) {
    SCOPED_TRACE(to_string(m));
    const AttnBlock g{150, 140, 2, 2, 4, 100, 90, m};  // more than one 128-row tile, keys partly in the future
    const int64_t C = g.heads * g.head_dim, mq = g.sq * g.batch, mk = g.sk * g.batch;
    Tensor q({mq, C}), k({mk, C}), v({mk, C}), dout({mq, C});
    test::fill_uniform(q.mat(), 41, -2, 2);
    test::fill_uniform(k.mat(), 42, -2, 2);
    test::fill_uniform(v.mat(), 43);
    test::fill_uniform(dout.mat(), 44);
    for (Tensor* t : {&q, &k, &v, &dout}) round_to_bf16(t->data(), t->numel());
    const Ref r = reference(to_f64(q.mat()), to_f64(k.mat()), to_f64(v.mat()), to_f64(dout.mat()),
                            iota(g.sq, g.q_pos0), iota(g.sk, g.k_pos0), g.batch, g.heads, g.head_dim, m);
    Tensor out[2] = {Tensor({mq, C}), Tensor({mq, C})}, grads[2][3];
    for (int i = 0; i < 2; ++i) {
      GemmComputeScope type(i == 0 ? DType::kF32 : DType::kBF16);
      std::vector<float> lse(static_cast<size_t>(mq * g.heads));
      block_attention_forward(q.mat(), k.mat(), v.mat(), g, out[i].mat(), lse.data());
      if (i == 1) {
        expect_close(out[1].mat(), r.out, std::ldexp(1.0, -8) + 2e-5, 0.0, "bf16 out");
        expect_lse(lse, r.lse, "bf16 lse");
      }
      grads[i][0] = Tensor({mq, C});
      grads[i][1] = Tensor({mk, C});
      grads[i][2] = Tensor({mk, C});
      block_attention_backward(q.mat(), k.mat(), v.mat(), out[i].mat(), lse.data(), dout.mat(), g,
                               grads[i][0].mat(), grads[i][1].mat(), grads[i][2].mat());
    }
    for (int w = 0; w < 3; ++w) {
      double diff = 0, norm = 0;
      for (int64_t e = 0; e < grads[0][w].numel(); ++e) {
        const double a = grads[0][w][e], b = grads[1][w][e];
        diff += (a - b) * (a - b);
        norm += a * a;
      }
      EXPECT_LE(std::sqrt(diff), 4 * std::ldexp(1.0, -8) * std::sqrt(norm)) << "gradient " << w;
      if (w == 0) EXPECT_GT(diff, 0.0) << "dq: the bf16 kernels did not run";
    }
  }
}

TEST(BlockAttention, FullyMaskedRowsGiveMinusInfinityAndNoNaN) {
  // Causal, keys starting after some queries: the first rows see nothing.
  run_single({9, 5, 2, 3, 4, 0, 4, AttnMask::kCausal});
  // Every row masked: out 0, lse −∞, gradients 0.
  const AttnBlock g{4, 3, 2, 2, 4, 0, 10, AttnMask::kCausal};
  EXPECT_TRUE(block_fully_masked(g));
  Tensor q({8, 8}), k({6, 8}), v({6, 8}), out({8, 8}), dout({8, 8}), dq({8, 8}), dk({6, 8}), dv({6, 8});
  test::fill_uniform(q.mat(), 5);
  test::fill_uniform(k.mat(), 6);
  test::fill_uniform(v.mat(), 7);
  test::fill_uniform(dout.mat(), 8);
  out.fill(7.0f);
  std::vector<float> lse(16, 1.0f);
  block_attention_forward(q.mat(), k.mat(), v.mat(), g, out.mat(), lse.data());
  for (int64_t i = 0; i < out.numel(); ++i) EXPECT_EQ(out[i], 0.0f);
  for (float l : lse) EXPECT_EQ(l, -std::numeric_limits<float>::infinity());
  block_attention_backward(q.mat(), k.mat(), v.mat(), out.mat(), lse.data(), dout.mat(), g, dq.mat(), dk.mat(),
                           dv.mat());
  for (const Tensor* t : {&dq, &dk, &dv})
    for (int64_t i = 0; i < t->numel(); ++i) EXPECT_EQ((*t)[i], 0.0f);
}

/// Keys split into blocks at arbitrary positions (queries also in two chunks, zig-zag style): partials merged by
/// lse equal the full attention, and the per-block backward with the merged (out, lse) accumulates its gradients.
TEST(BlockAttention, BlocksMergeToFullAttention) {
  const int64_t B = 2, H = 3, D = 5, c = 11;  // 4 chunks of 11 positions: queries hold chunks 0 and 3
  const int64_t C = H * D;
  for (AttnMask mask : {AttnMask::kCausal, AttnMask::kFull}) {
    SCOPED_TRACE(to_string(mask));
    Tensor q({2 * c * B, C}), k({4 * c * B, C}), v({4 * c * B, C}), dout({2 * c * B, C});
    test::fill_uniform(q.mat(), 11, -2, 2);
    test::fill_uniform(k.mat(), 12, -2, 2);
    test::fill_uniform(v.mat(), 13);
    test::fill_uniform(dout.mat(), 14);
    const int64_t q_chunks[2] = {0, 3};
    std::vector<int64_t> qpos;
    for (int64_t qc : q_chunks)
      for (int64_t t = 0; t < c; ++t) qpos.push_back(qc * c + t);
    const Ref r = reference(to_f64(q.mat()), to_f64(k.mat()), to_f64(v.mat()), to_f64(dout.mat()), qpos,
                            iota(4 * c, 0), B, H, D, mask);
    Tensor out({2 * c * B, C}), part({c * B, C});
    std::vector<float> lse(static_cast<size_t>(2 * c * B * H), -std::numeric_limits<float>::infinity());
    std::vector<float> plse(static_cast<size_t>(c * B * H));
    auto geom = [&](int a, int e) { return AttnBlock{c, c, B, H, D, q_chunks[a] * c, e * c, mask}; };
    for (int e = 3; e >= 0; --e)  // an order unlike the positions'
      for (int a = 0; a < 2; ++a) {
        const AttnBlock g = geom(a, static_cast<int>(e));
        if (block_fully_masked(g)) continue;
        block_attention_forward(q.mat().slice_rows(a * c * B, c * B), k.mat().slice_rows(e * c * B, c * B),
                                v.mat().slice_rows(e * c * B, c * B), g, part.mat(), plse.data());
        attention_merge_partial(out.mat().slice_rows(a * c * B, c * B), lse.data() + a * c * B * H, part.mat(),
                                plse.data(), H, D);
      }
    expect_close(out.mat(), r.out, 1e-6, 1e-5, "merged out");
    expect_lse(lse, r.lse, "merged lse");
    Tensor dq({2 * c * B, C}), dk({4 * c * B, C}), dv({4 * c * B, C});
    for (int e = 0; e < 4; ++e)
      for (int a = 0; a < 2; ++a) {
        const AttnBlock g = geom(a, e);
        if (block_fully_masked(g)) continue;
        auto rows = [&](const Tensor& t, int64_t i) { return t.mat().slice_rows(i * c * B, c * B); };
        block_attention_backward(rows(q, a), rows(k, e), rows(v, e), rows(out, a), lse.data() + a * c * B * H,
                                 rows(dout, a), g, dq.mat().slice_rows(a * c * B, c * B),
                                 dk.mat().slice_rows(e * c * B, c * B), dv.mat().slice_rows(e * c * B, c * B));
      }
    expect_close(dq.mat(), r.dq, 1e-5, 1e-4, "dq");
    expect_close(dk.mat(), r.dk, 1e-5, 1e-4, "dk");
    expect_close(dv.mat(), r.dv, 1e-5, 1e-4, "dv");
  }
}

TEST(BlockAttention, MergeHandlesMinusInfinity) {
  const float ninf = -std::numeric_limits<float>::infinity();
  Tensor acc({1, 4}), part({1, 4});
  part.fill(2.0f);
  float acc_lse[2] = {ninf, ninf}, part_lse[2] = {ninf, 0.5f};
  attention_merge_partial(acc.mat(), acc_lse, part.mat(), part_lse, 2, 2);
  // Head 0: both −∞ stays (0, −∞). Head 1: takes the partial.
  EXPECT_EQ(acc_lse[0], ninf);
  EXPECT_EQ(acc[0], 0.0f);
  EXPECT_EQ(acc[1], 0.0f);
  EXPECT_EQ(acc_lse[1], 0.5f);
  EXPECT_EQ(acc[2], 2.0f);
  // A −∞ partial leaves a finite accumulator as it is.
  float none[2] = {ninf, ninf};
  attention_merge_partial(acc.mat(), acc_lse, part.mat(), none, 2, 2);
  EXPECT_EQ(acc_lse[1], 0.5f);
  EXPECT_EQ(acc[3], 2.0f);
  // Equal lse: the average, lse + log 2.
  Tensor other({1, 4});
  other.fill(4.0f);
  float same[2] = {ninf, 0.5f};
  attention_merge_partial(acc.mat(), acc_lse, other.mat(), same, 2, 2);
  EXPECT_FLOAT_EQ(acc[2], 3.0f);
  EXPECT_FLOAT_EQ(acc_lse[1], 0.5f + std::log(2.0f));
}

}  // namespace
}  // namespace coc
