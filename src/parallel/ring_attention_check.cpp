// The fp64 reference of `coc check --op ring_attention` (see coc/parallel/ring_attention_check.h).
#include "coc/parallel/ring_attention_check.h"

#include <cmath>
#include <limits>

#include "coc/core/bf16.h"
#include "coc/core/error.h"

namespace coc {

namespace {

struct Grads {
  std::vector<double> out, dq, dk, dv;
};

/// Full attention of q, k, v [S·B, H·D] (global row order) in fp64, and its gradients for dout: the textbook
/// softmax backward, row by row.
Grads reference(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                const std::vector<float>& dout, int64_t S, int64_t B, int64_t H, int64_t D, AttnMask mask) {
  const int64_t C = H * D;
  Grads g;
  g.out.assign(q.size(), 0.0);
  g.dq.assign(q.size(), 0.0);
  g.dk.assign(q.size(), 0.0);
  g.dv.assign(q.size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> p(static_cast<size_t>(S)), dp(static_cast<size_t>(S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < H; ++j)
      for (int64_t t = 0; t < S; ++t) {
        const int64_t qi = (t * B + b) * C + j * D, n = mask == AttnMask::kCausal ? t + 1 : S;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s < n; ++s) {
          const int64_t ki = (s * B + b) * C + j * D;
          double acc = 0.0;
          for (int64_t c = 0; c < D; ++c) acc += static_cast<double>(q[qi + c]) * k[ki + c];
          p[s] = acc * scale;
          mx = std::max(mx, p[s]);
        }
        double sum = 0.0;
        for (int64_t s = 0; s < n; ++s) sum += (p[s] = std::exp(p[s] - mx));
        double dot = 0.0;
        for (int64_t s = 0; s < n; ++s) {
          p[s] /= sum;
          const int64_t vi = (s * B + b) * C + j * D;
          double d = 0.0;
          for (int64_t c = 0; c < D; ++c) {
            g.out[qi + c] += p[s] * v[vi + c];
            d += static_cast<double>(dout[qi + c]) * v[vi + c];
            g.dv[vi + c] += p[s] * dout[qi + c];
          }
          dp[s] = d;
          dot += p[s] * d;
        }
        for (int64_t s = 0; s < n; ++s) {
          const double ds = p[s] * (dp[s] - dot) * scale;
          const int64_t ki = (s * B + b) * C + j * D;
          for (int64_t c = 0; c < D; ++c) {
            g.dq[qi + c] += ds * k[ki + c];
            g.dk[ki + c] += ds * q[qi + c];
          }
        }
      }
  return g;
}

/// Errors of this rank's local rows `got` against the zig-zag rows of the global reference.
ErrorStat compare(const Tensor& got, const std::vector<double>& ref, int64_t S, int64_t B, int r, int P) {
  ErrorStat e;
  const int64_t C = got.cols();
  for (int64_t t = 0; t < got.rows() / B; ++t) {
    const int64_t gpos = zigzag_position(t, r, P, S);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c) e.add(got.mat().row(t * B + b)[c], ref[static_cast<size_t>((gpos * B + b) * C + c)]);
  }
  return e;
}

}  // namespace

RingAttentionCheck check_ring_attention(const CpRing& ring, const RingAttentionCase& c) {
  if (c.seq < 1 || c.batch < 1 || c.heads < 1 || c.head_dim < 1)
    throw_invalid("ring attention check: --seq-length {}, batch {}, --num-attention-heads {}, head dim {} must be "
                  ">= 1",
                  c.seq, c.batch, c.heads, c.head_dim);
  const int P = ring.size(), r = ring.rank();
  check_ring_attention_sizes(c.seq, P, c.opts.window_size);
  const int64_t S = c.seq, B = c.batch, H = c.heads, D = c.head_dim, C = H * D, L = S / P * B;
  auto draw = [&](uint64_t seed) {
    std::vector<float> x = consistency_data(S * B * C, seed);
    if (c.bf16_values) round_to_bf16(x.data(), static_cast<int64_t>(x.size()));
    return x;
  };
  const auto Q = draw(c.seed), K = draw(c.seed + 1), V = draw(c.seed + 2), dO = draw(c.seed + 3);
  auto local = [&](const std::vector<float>& full) {
    Tensor t({L, C});
    zigzag_gather(ConstMatrixView{full.data(), S * B, C, C}, B, r, P, t.mat());
    return t;
  };
  const Tensor q = local(Q), k = local(K), v = local(V), dout = local(dO);
  RingAttentionCheck res;
  res.out = Tensor({L, C});
  res.dq = Tensor({L, C});
  res.dk = Tensor({L, C});
  res.dv = Tensor({L, C});
  std::vector<float> lse(static_cast<size_t>(L * H));
  ring_attention_forward(ring, q.mat(), k.mat(), v.mat(), B, H, D, c.opts, res.out.mat(), lse.data());
  ring_attention_backward(ring, q.mat(), k.mat(), v.mat(), res.out.mat(), lse.data(), dout.mat(), B, H, D, c.opts,
                          res.dq.mat(), res.dk.mat(), res.dv.mat());
  const Grads g = reference(Q, K, V, dO, S, B, H, D, c.opts.mask);
  res.errors = {{"out", compare(res.out, g.out, S, B, r, P)},
                {"dq", compare(res.dq, g.dq, S, B, r, P)},
                {"dk", compare(res.dk, g.dk, S, B, r, P)},
                {"dv", compare(res.dv, g.dv, S, B, r, P)}};
  return res;
}

}  // namespace coc
