// The MoE layer against a single-rank fp64 reference (parallel/moe_check.h).
#include "coc/parallel/moe_check.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "coc/core/error.h"

namespace coc {

namespace {

/// The full model's weights, drawn like every consistency check's data and scaled by 1/sqrt(fan-in).
std::vector<float> weights(int64_t n, int64_t fan_in, uint64_t seed) {
  std::vector<float> w = consistency_data(n, seed);
  const float s = 1.0f / std::sqrt(static_cast<float>(fan_in));
  for (float& v : w) v *= s;
  return w;
}

/// Token shard [begin, end) of dp-cp rank `r` of `n`.
std::pair<int64_t, int64_t> shard(int64_t T, int r, int n, bool empty_rank) {
  if (!empty_rank || n == 1) return {T * r / n, T * (r + 1) / n};
  if (r == 0) return {0, 0};
  return {T * (r - 1) / (n - 1), T * r / (n - 1)};
}

struct Reference {
  std::vector<double> y, dx, d_router, d_gate_up, d_down;
  double aux = 0;
};

/// The routing of the whole batch in fp64: router probabilities [T, E], each token's K (expert, weight) slots
/// [T·K], tokens per expert and the probability mass per expert (the aux loss's two factors), and which slots
/// survive the capacity drop [T·K].
struct Routing {
  std::vector<double> probs, weight, psum;
  std::vector<int> expert;
  std::vector<int64_t> counts;
  std::vector<uint8_t> kept;
};

/// Softmax over the router logits of every token and its top-k (or the fixed pattern's) experts.
Routing route(const MoeCheckCase& c, const std::vector<float>& X, const std::vector<float>& R) {
  const MoeConfig& m = c.cfg;
  const int64_t T = c.tokens, H = m.hidden;
  const int E = m.num_experts, K = m.topk;
  Routing rt;
  rt.probs.resize(static_cast<size_t>(T * E));
  rt.expert.resize(static_cast<size_t>(T * K));
  rt.weight.resize(static_cast<size_t>(T * K));
  rt.counts.assign(static_cast<size_t>(E), 0);
  rt.psum.assign(static_cast<size_t>(E), 0);
  for (int64_t t = 0; t < T; ++t) {
    double* p = &rt.probs[static_cast<size_t>(t * E)];
    double mx = -1e300;
    for (int e = 0; e < E; ++e) {
      double l = 0;
      for (int64_t i = 0; i < H; ++i) l += static_cast<double>(X[t * H + i]) * R[e * H + i];
      p[e] = l;
      mx = std::max(mx, l);
    }
    double s = 0;
    for (int e = 0; e < E; ++e) s += (p[e] = std::exp(p[e] - mx));
    for (int e = 0; e < E; ++e) p[e] /= s;
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    for (int j = 0; j < K; ++j) {
      int e = order[static_cast<size_t>(j)];
      // The fixed patterns, written out from their definitions in kernels/moe.h.
      if (m.fixed_router == RouterPattern::kBalanced) e = static_cast<int>((t + j) % E);
      if (m.fixed_router == RouterPattern::kSkewed) {
        const int first = (t % 10 != 9 || E == 1) ? 0 : 1 + static_cast<int>(t % (E - 1));
        e = (first + j) % E;
      }
      if (m.fixed_router == RouterPattern::kEmpty) e = static_cast<int>((t + j) % std::max(K, E / 2));
      rt.expert[static_cast<size_t>(t * K + j)] = e;
      rt.weight[static_cast<size_t>(t * K + j)] = p[e];
      ++rt.counts[static_cast<size_t>(e)];
    }
    for (int e = 0; e < E; ++e) rt.psum[static_cast<size_t>(e)] += p[e];
  }
  return rt;
}

/// Marks the slots each dp-cp shard of `shards` drops beyond an expert's capacity (lowest weights first), as each
/// rank drops locally; keeps every slot without a capacity factor.
void drop_over_capacity(const MoeCheckCase& c, int shards, Routing& rt) {
  const MoeConfig& m = c.cfg;
  const int64_t T = c.tokens;
  const int E = m.num_experts, K = m.topk;
  rt.kept.assign(static_cast<size_t>(T * K), 1);
  if (m.capacity_factor <= 0) return;
  for (int r = 0; r < shards; ++r) {
    const auto [b, en] = shard(T, r, shards, c.empty_rank);
    const int64_t cap = static_cast<int64_t>(std::ceil(static_cast<double>(en - b) * K / E * m.capacity_factor));
    for (int e = 0; e < E; ++e) {
      std::vector<int64_t> slots;
      for (int64_t s = b * K; s < en * K; ++s)
        if (rt.expert[static_cast<size_t>(s)] == e) slots.push_back(s);
      std::stable_sort(slots.begin(), slots.end(), [&](int64_t a, int64_t z) {
        return rt.weight[static_cast<size_t>(a)] > rt.weight[static_cast<size_t>(z)];
      });
      for (size_t i = static_cast<size_t>(std::min<int64_t>(cap, static_cast<int64_t>(slots.size())));
           i < slots.size(); ++i)
        rt.kept[static_cast<size_t>(slots[i])] = 0;
    }
  }
}

/// One expert's SwiGLU FFN on one token in fp64, forward and backward, with its scratch buffers: h [2F] (gate and
/// up), act [F], dact [F], dh [2F].
struct ExpertSlot {
  std::vector<double> h, act, dact, dh;
  explicit ExpertSlot(int64_t F)
      : h(static_cast<size_t>(2 * F)), act(static_cast<size_t>(F)), dact(static_cast<size_t>(F)),
        dh(static_cast<size_t>(2 * F)) {}
};

/// Token `t`'s slot to expert `e` with routing weight `w`: adds w·expert(x) to ref.y and the gradients of
/// Σ dY ⊙ Y to ref.d_down, ref.d_gate_up and ref.dx; returns dY·expert(x), the gradient of the routing weight.
double expert_slot(const MoeCheckCase& c, const float* x, const float* g, int64_t t, int e, double w,
                   const std::vector<float>& Wgu, const std::vector<float>& Wd, ExpertSlot& sc, Reference& ref) {
  const int64_t H = c.cfg.hidden, F = c.cfg.ffn_hidden;
  const float* wgu = &Wgu[static_cast<size_t>(e * 2 * F * H)];
  const float* wd = &Wd[static_cast<size_t>(e * H * F)];
  for (int64_t f = 0; f < 2 * F; ++f) {
    double s = 0;
    for (int64_t i = 0; i < H; ++i) s += static_cast<double>(wgu[f * H + i]) * x[i];
    sc.h[static_cast<size_t>(f)] = s;
  }
  for (int64_t f = 0; f < F; ++f) {
    const double a = sc.h[static_cast<size_t>(f)], sig = 1 / (1 + std::exp(-a));
    sc.act[static_cast<size_t>(f)] = a * sig * sc.h[static_cast<size_t>(F + f)];
  }
  double dw = 0;
  for (int64_t i = 0; i < H; ++i) {
    double s = 0;
    for (int64_t f = 0; f < F; ++f) s += static_cast<double>(wd[i * F + f]) * sc.act[static_cast<size_t>(f)];
    ref.y[static_cast<size_t>(t * H + i)] += w * s;
    dw += g[i] * s;
  }
  // Expert backward with dout = w · dy.
  std::fill(sc.dact.begin(), sc.dact.end(), 0.0);
  for (int64_t i = 0; i < H; ++i) {
    const double dout = w * g[i];
    for (int64_t f = 0; f < F; ++f) {
      ref.d_down[static_cast<size_t>(e * H * F + i * F + f)] += dout * sc.act[static_cast<size_t>(f)];
      sc.dact[static_cast<size_t>(f)] += dout * wd[i * F + f];
    }
  }
  for (int64_t f = 0; f < F; ++f) {
    const double a = sc.h[static_cast<size_t>(f)], u = sc.h[static_cast<size_t>(F + f)], sig = 1 / (1 + std::exp(-a));
    sc.dh[static_cast<size_t>(F + f)] = sc.dact[static_cast<size_t>(f)] * a * sig;
    sc.dh[static_cast<size_t>(f)] = sc.dact[static_cast<size_t>(f)] * u * sig * (1 + a * (1 - sig));
  }
  for (int64_t f = 0; f < 2 * F; ++f)
    for (int64_t i = 0; i < H; ++i) {
      ref.d_gate_up[static_cast<size_t>(e * 2 * F * H + f * H + i)] += sc.dh[static_cast<size_t>(f)] * x[i];
      ref.dx[static_cast<size_t>(t * H + i)] += sc.dh[static_cast<size_t>(f)] * wgu[f * H + i];
    }
  return dw;
}

/// The softmax router's backward for token `t`: from the gradients `dprob` [E] of its probabilities `p` [E] to
/// ref.d_router and ref.dx.
void router_backward(int64_t t, int64_t H, int E, const double* p, const std::vector<double>& dprob, const float* x,
                     const std::vector<float>& R, Reference& ref) {
  double dot = 0;
  for (int e = 0; e < E; ++e) dot += p[e] * dprob[static_cast<size_t>(e)];
  for (int e = 0; e < E; ++e) {
    const double dl = p[e] * (dprob[static_cast<size_t>(e)] - dot);
    for (int64_t i = 0; i < H; ++i) {
      ref.d_router[static_cast<size_t>(e * H + i)] += dl * x[i];
      ref.dx[static_cast<size_t>(t * H + i)] += dl * R[static_cast<size_t>(e * H + i)];
    }
  }
}

/// The fp64 MoE of the whole batch: routing (top-k or the fixed pattern, capacity per dp-cp shard as each rank
/// drops locally), experts, the aux loss over all tokens, and the gradients of Σ dY ⊙ Y + aux.
Reference reference(const MoeCheckCase& c, const std::vector<float>& X, const std::vector<float>& dY,
                    const std::vector<float>& R, const std::vector<float>& Wgu, const std::vector<float>& Wd,
                    int shards) {
  const MoeConfig& m = c.cfg;
  const int64_t T = c.tokens, H = m.hidden;
  const int E = m.num_experts, K = m.topk;
  Reference ref;
  ref.y.assign(static_cast<size_t>(T * H), 0);
  ref.dx.assign(static_cast<size_t>(T * H), 0);
  ref.d_router.assign(R.size(), 0);
  ref.d_gate_up.assign(Wgu.size(), 0);
  ref.d_down.assign(Wd.size(), 0);
  Routing rt = route(c, X, R);
  drop_over_capacity(c, shards, rt);
  double aux = 0;
  for (int e = 0; e < E; ++e)
    aux += static_cast<double>(rt.counts[static_cast<size_t>(e)]) / (static_cast<double>(T) * K) *
           (rt.psum[static_cast<size_t>(e)] / static_cast<double>(T));
  ref.aux = T > 0 ? m.aux_loss_coeff * E * aux : 0;
  ExpertSlot scratch(m.ffn_hidden);
  std::vector<double> dprob(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* x = &X[static_cast<size_t>(t * H)];
    const float* g = &dY[static_cast<size_t>(t * H)];
    std::fill(dprob.begin(), dprob.end(), 0.0);
    for (int e = 0; e < E; ++e)
      dprob[static_cast<size_t>(e)] =
          m.aux_loss_coeff * E *
          (static_cast<double>(rt.counts[static_cast<size_t>(e)]) / (static_cast<double>(T) * K)) /
          static_cast<double>(T);
    for (int j = 0; j < K; ++j) {
      if (!rt.kept[static_cast<size_t>(t * K + j)]) continue;
      const int e = rt.expert[static_cast<size_t>(t * K + j)];
      const double w = rt.weight[static_cast<size_t>(t * K + j)];
      dprob[static_cast<size_t>(e)] += expert_slot(c, x, g, t, e, w, Wgu, Wd, scratch, ref);
    }
    router_backward(t, H, E, &rt.probs[static_cast<size_t>(t * E)], dprob, x, R, ref);
  }
  return ref;
}

ErrorStat compare(const float* got, const double* ref, int64_t n) {
  ErrorStat s;
  for (int64_t i = 0; i < n; ++i) s.add(got[i], ref[i]);
  return s;
}

}  // namespace

MoeCheckResult check_moe_layer(Mesh& mesh, const MoeCheckCase& c) {
  COC_ASSERT(mesh.tp_size() == 1 && mesh.cp_size() == 1, "check_moe_layer needs tp = cp = 1 (got {}, {})",
             mesh.tp_size(), mesh.cp_size());
  const MoeConfig& m = c.cfg;
  check_moe_config(m, mesh.ep_size());
  if (c.tokens < 0) throw_invalid("--m {}: the MoE check needs >= 0 tokens", c.tokens);
  const int64_t T = c.tokens, H = m.hidden, F = m.ffn_hidden;
  const int E = m.num_experts, Le = E / mesh.ep_size();
  const std::vector<float> X = consistency_data(T * H, c.seed), dY = consistency_data(T * H, c.seed + 1);
  const std::vector<float> R = weights(E * H, H, c.seed + 2), Wgu = weights(E * 2 * F * H, H, c.seed + 3),
                           Wd = weights(E * H * F, F, c.seed + 4);
  Communicator& dpcp = *mesh.dp_cp;
  MoeLayer layer(m, *mesh.ep, dpcp, "moe", c.seed);
  std::copy(R.begin(), R.end(), layer.router.value.data());
  const int64_t e0 = static_cast<int64_t>(mesh.ep_rank()) * Le;
  std::copy_n(Wgu.begin() + e0 * 2 * F * H, Le * 2 * F * H, layer.w_gate_up.value.data());
  std::copy_n(Wd.begin() + e0 * H * F, Le * H * F, layer.w_down.value.data());
  const auto [b, en] = shard(T, dpcp.rank(), dpcp.size(), c.empty_rank);
  const int64_t n = en - b;
  ConstMatrixView x{X.data() + b * H, n, H, H}, dy{dY.data() + b * H, n, H, H};
  Tensor y({n, H}), dx({n, H});
  layer.forward(x, y.mat(), b);
  layer.backward(dy, dx.mat());
  MoeCheckResult res;
  res.aux_loss = layer.aux_loss();
  res.local_expert_tokens = layer.local_expert_tokens();
  res.output.assign(y.data(), y.data() + y.numel());
  // Full gradients: router summed over dp-cp; experts summed over expert-dp, then gathered over ep.
  res.router_grad.assign(layer.router.grad.data(), layer.router.grad.data() + layer.router.grad.numel());
  dpcp.all_reduce(res.router_grad.data(), static_cast<int64_t>(res.router_grad.size()), ReduceOp::kSum,
                  "moe check router grad")
      .wait();
  auto full_expert = [&](Tensor& g) {
    mesh.expert_dp->all_reduce(g.data(), g.numel(), ReduceOp::kSum, "moe check expert grad").wait();
    std::vector<float> full(static_cast<size_t>(g.numel() * mesh.ep_size()));
    std::vector<int64_t> counts(static_cast<size_t>(mesh.ep_size()), g.numel()), displs(counts.size());
    for (size_t r = 0; r < displs.size(); ++r) displs[r] = static_cast<int64_t>(r) * g.numel();
    mesh.ep->all_gather(g.data(), full.data(), counts, displs, "moe check expert grad").wait();
    return full;
  };
  res.gate_up_grad = full_expert(layer.w_gate_up.grad);
  res.down_grad = full_expert(layer.w_down.grad);
  const Reference ref = reference(c, X, dY, R, Wgu, Wd, dpcp.size());
  res.errors.emplace_back("output", compare(y.data(), ref.y.data() + b * H, n * H));
  ErrorStat aux;
  aux.add(static_cast<float>(res.aux_loss), ref.aux);
  if (m.aux_loss_coeff > 0) res.errors.emplace_back("aux loss", aux);
  res.errors.emplace_back("dx", compare(dx.data(), ref.dx.data() + b * H, n * H));
  res.errors.emplace_back("router grad", compare(res.router_grad.data(), ref.d_router.data(),
                                                 static_cast<int64_t>(ref.d_router.size())));
  res.errors.emplace_back("gate_up grad", compare(res.gate_up_grad.data(), ref.d_gate_up.data(),
                                                  static_cast<int64_t>(ref.d_gate_up.size())));
  res.errors.emplace_back("down grad", compare(res.down_grad.data(), ref.d_down.data(),
                                               static_cast<int64_t>(ref.d_down.size())));
  return res;
}

}  // namespace coc
