#include "coc/parallel/consistency.h"

#include <cmath>
#include <optional>
#include <random>

#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/overlap/partition.h"
#include "coc/parallel/linear.h"

namespace coc {

void ErrorStat::add(float got, double ref) {
  abs = std::max(abs, std::fabs(static_cast<double>(got) - ref));
  scale = std::max(scale, std::fabs(ref));
}

void ErrorStat::add_bounded(float got, double ref, double bound) {
  abs = std::max(abs, std::fabs(static_cast<double>(got) - ref) / bound);
  scale = 1;
}

double bf16_op_bound(double ref, double abs_sum, int64_t k, int T) {
  const double u = std::ldexp(1.0, -8), e = std::ldexp(1.0, -24) * static_cast<double>(k + T);
  return 1.01 * (u * std::fabs(ref) + (T + 1) * u * abs_sum + e / (1 - e) * abs_sum) + 1e-30;
}

namespace {


size_t at(int64_t i) { return static_cast<size_t>(i); }

/// fp64 y[m, n] = x[m, k] · W (+ b), W stored [n, k] (nk) or [k, n].
std::vector<double> ref_matmul(const std::vector<float>& x, int64_t m, int64_t k, const std::vector<float>& w,
                               int64_t n, bool nk, const float* b) {
  std::vector<double> y(at(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    double* yr = &y[at(i * n)];
    if (b)
      for (int64_t j = 0; j < n; ++j) yr[j] = b[j];
    for (int64_t p = 0; p < k; ++p) {
      const double a = x[at(i * k + p)];
      for (int64_t j = 0; j < n; ++j) yr[j] += a * (nk ? w[at(j * k + p)] : w[at(p * n + j)]);
    }
  }
  return y;
}

ConsistencyResult check_op(Communicator& tp, const ConsistencyCase& c) {
  const int T = tp.size(), r = tp.rank();
  const bool nk = c.layout == WeightLayout::kNK;
  const int64_t m = c.m, k = c.k, n = c.n;
  auto A = consistency_data(m * k, c.seed), W = consistency_data(k * n, c.seed + 1),
       B = consistency_data(n, c.seed + 2);
  CocOptions opts = c.coc;
  std::vector<double> abs_sum;  // --bf16: Σ|a·w| per output element, for bf16_op_bound
  if (c.bf16) {
    for (auto* v : {&A, &W, &B}) round_to_bf16(v->data(), static_cast<int64_t>(v->size()));
    opts.comm_dtype = DType::kBF16;
    std::vector<float> Aa(A), Wa(W);
    for (auto* v : {&Aa, &Wa})
      for (float& x : *v) x = std::fabs(x);
    abs_sum = ref_matmul(Aa, m, k, Wa, n, nk, nullptr);
  }
  const float* bias = c.bias ? B.data() : nullptr;
  std::vector<double> ref = ref_matmul(A, m, k, W, n, nk, bias);
  ErrorStat out_err, gathered_err;
  // out[i] against ref[ref0 + i]: the relative error, or under --bf16 the ratio to the bound.
  auto check_out = [&](const Tensor& out, int64_t ref0) {
    for (int64_t i = 0; i < out.numel(); ++i) {
      if (c.bf16)
        out_err.add_bounded(out[i], ref[at(ref0 + i)], bf16_op_bound(ref[at(ref0 + i)], abs_sum[at(ref0 + i)], k, T));
      else
        out_err.add(out[i], ref[at(ref0 + i)]);
    }
  };
  if (c.op == "all_gather_matmul" || c.op == "all_gather_matmul_v2") {
    // Column-parallel use: each rank holds an m-slice of A and the whole W.
    RowRange sh = split_rows(m, T, r);
    Tensor a({sh.count, k}), out({m, n}), gathered({m, k});
    std::copy(A.begin() + sh.begin * k, A.begin() + sh.end() * k, a.data());
    Tensor w(nk ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n});
    std::copy(W.begin(), W.end(), w.data());
    if (c.op == "all_gather_matmul_v2") {
      all_gather_matmul_v2(tp, a.mat(), w.mat(), c.layout, out.mat(), gathered.mat(), bias, opts);
      for (int64_t i = 0; i < m * k; ++i) gathered_err.add(gathered[i], A[at(i)]);
    } else {
      all_gather_matmul(tp, a.mat(), w.mat(), c.layout, out.mat(), bias, opts);
    }
    check_out(out, 0);
  } else if (c.op == "matmul_all_reduce" || c.op == "matmul_reduce_scatter") {
    // Row-parallel use: each rank holds a k-slice of A and of W.
    RowRange ks = split_rows(k, T, r);
    Tensor a({m, ks.count});
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < ks.count; ++p) a[i * ks.count + p] = A[at(i * k + ks.begin + p)];
    Tensor w(nk ? std::vector<int64_t>{n, ks.count} : std::vector<int64_t>{ks.count, n});
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < ks.count; ++p) {
        if (nk)
          w[j * ks.count + p] = W[at(j * k + ks.begin + p)];
        else
          w[p * n + j] = W[at((ks.begin + p) * n + j)];
      }
    if (c.op == "matmul_all_reduce") {
      Tensor out({m, n});
      matmul_all_reduce(tp, a.mat(), w.mat(), c.layout, out.mat(), bias, opts);
      check_out(out, 0);
    } else {
      RowRange sh = split_rows(m, T, r);
      Tensor out({sh.count, n});
      matmul_reduce_scatter(tp, a.mat(), w.mat(), c.layout, out.mat(), bias, opts);
      check_out(out, sh.begin * n);
    }
  } else {
    throw_invalid("unknown op '{}'; use matmul_all_reduce, matmul_reduce_scatter, all_gather_matmul or "
                  "all_gather_matmul_v2",
                  c.op);
  }
  ConsistencyResult res{{c.bf16 ? "output / bf16 bound" : "output", out_err}};
  if (c.op == "all_gather_matmul_v2") res.emplace_back("gathered input", gathered_err);
  return res;
}

/// A linear layer's fp64 reference: Y = X·Wᵀ + b, dX = dY·W, dW = dYᵀ·X, db = colsum(dY); X [m, k], W [n, k],
/// dY [m, n].
struct LayerReference {
  std::vector<double> Y, dX, dW, db;
  LayerReference(const std::vector<float>& X, const std::vector<float>& W, const std::vector<float>& DY,
                 const float* bias, int64_t m, int64_t k, int64_t n)
      : Y(ref_matmul(X, m, k, W, n, true, bias)),
        dX(ref_matmul(DY, m, n, W, k, false, nullptr)),  // W [n, k] read as [K=n, N=k]
        dW(at(n * k), 0.0),
        db(at(n), 0.0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const double d = DY[at(i * n + j)];
        db[at(j)] += d;
        for (int64_t p = 0; p < k; ++p) dW[at(j * k + p)] += d * X[at(i * k + p)];
      }
  }
};

std::vector<float> absolute(std::vector<float> v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

/// Under --bf16, the layer's check: the same inputs rounded to bf16, and each result held to bf16_op_bound with the
/// length of its own sum (k for Y, n for dX, m tokens for dW and db) and S from the absolute reference.
struct LayerErrors {
  LayerErrors(const LayerReference& r, const LayerReference* a, int64_t m_, int64_t k_, int64_t n_, int T_)
      : ref(r), abs(a), m(m_), k(k_), n(n_), T(T_) {}
  ErrorStat ey, edx, edw, edb;
  const LayerReference& ref;
  const LayerReference* abs;  ///< the reference of |X|, |W|, |dY|, |b| (--bf16 only; null in fp32)
  int64_t m, k, n;
  int T;
  void add(ErrorStat& e, float got, const std::vector<double> LayerReference::*what, int64_t i, int64_t len) {
    const double want = (ref.*what)[at(i)];
    if (abs)
      e.add_bounded(got, want, bf16_op_bound(want, (abs->*what)[at(i)], len, T));
    else
      e.add(got, want);
  }
  void y(float got, int64_t i) { add(ey, got, &LayerReference::Y, i, k); }
  void dx(float got, int64_t i) { add(edx, got, &LayerReference::dX, i, n); }
  void dw(float got, int64_t i) { add(edw, got, &LayerReference::dW, i, m); }
  void db(float got, int64_t i) { add(edb, got, &LayerReference::db, i, m); }
};

ConsistencyResult check_layer(Communicator& tp, const ConsistencyCase& c) {
  const int T = tp.size(), r = tp.rank();
  OverlapConfig f = c.overlap();
  if (c.bf16) f.comm_dtype = DType::kBF16;
  ParallelContext ctx = make_parallel_context(tp, f, c.coc.stats);
  ctx.coc.tag = c.coc.tag;
  const int64_t m = c.m, k = c.k, n = c.n;
  auto X = consistency_data(m * k, c.seed), W = consistency_data(n * k, c.seed + 1),
       B = consistency_data(n, c.seed + 2),
       DY = consistency_data(m * n, c.seed + 3);
  if (c.bf16)
    for (auto* v : {&X, &W, &B, &DY}) round_to_bf16(v->data(), static_cast<int64_t>(v->size()));
  const LayerReference ref(X, W, DY, c.bias ? B.data() : nullptr, m, k, n);
  std::optional<LayerReference> abs_ref;
  if (c.bf16) {
    const std::vector<float> Ba = absolute(B);
    abs_ref.emplace(absolute(X), absolute(W), absolute(DY), c.bias ? Ba.data() : nullptr, m, k, n);
  }
  RowRange sh = split_rows(m, T, r);
  LayerErrors err(ref, abs_ref ? &*abs_ref : nullptr, m, k, n, T);
  if (c.layer == "column") {
    ColumnParallelLinear layer("check.column", k, n, &ctx, {.bias = c.bias});
    layer.weight.requires_grad = layer.bias.requires_grad = !c.frozen_weight;
    RowRange nr = split_rows(n, T, r);
    for (int64_t j = 0; j < nr.count; ++j) {
      std::copy(W.begin() + (nr.begin + j) * k, W.begin() + (nr.begin + j + 1) * k, layer.weight.value.data() + j * k);
      if (c.bias) layer.bias.value[j] = B[at(nr.begin + j)];
    }
    const int64_t rows_in = c.sequence_parallel ? sh.count : m, row0 = c.sequence_parallel ? sh.begin : 0;
    Tensor x({rows_in, k}), y({m, nr.count}), dy({m, nr.count}), dx({rows_in, k});
    std::copy(X.begin() + row0 * k, X.begin() + (row0 + rows_in) * k, x.data());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < nr.count; ++j) dy[i * nr.count + j] = DY[at(i * n + nr.begin + j)];
    layer.forward(x.mat(), m, y.mat());
    layer.backward(dy.mat(), dx.mat());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < nr.count; ++j) err.y(y[i * nr.count + j], i * n + nr.begin + j);
    for (int64_t i = 0; i < rows_in * k; ++i) err.dx(dx[i], row0 * k + i);
    for (int64_t i = 0; i < nr.count * k; ++i) err.dw(layer.weight.grad[i], nr.begin * k + i);
    if (c.bias)
      for (int64_t j = 0; j < nr.count; ++j) err.db(layer.bias.grad[j], nr.begin + j);
  } else if (c.layer == "row") {
    RowParallelLinear layer("check.row", k, n, &ctx, {.bias = c.bias, .input_is_parallel = c.input_is_parallel});
    layer.weight.requires_grad = layer.bias.requires_grad = !c.frozen_weight;
    RowRange ks = split_rows(k, T, r);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < ks.count; ++p) layer.weight.value[j * ks.count + p] = W[at(j * k + ks.begin + p)];
    if (c.bias) std::copy(B.begin(), B.end(), layer.bias.value.data());
    const int64_t rows_out = c.sequence_parallel ? sh.count : m, row0 = c.sequence_parallel ? sh.begin : 0;
    // input_is_parallel = false: every rank passes the full X and gets the full dX back.
    const int64_t kin = c.input_is_parallel ? ks.count : k, kb = c.input_is_parallel ? ks.begin : 0;
    Tensor x({m, kin}), y({rows_out, n}), dy({rows_out, n}), dx({m, kin});
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < kin; ++p) x[i * kin + p] = X[at(i * k + kb + p)];
    std::copy(DY.begin() + row0 * n, DY.begin() + (row0 + rows_out) * n, dy.data());
    layer.forward(x.mat(), m, y.mat());
    WgradQueue wgrad;  // --delay-wgrad-compute queues the row layer's dW here; nothing follows to run it
    layer.backward(dy.mat(), dx.mat(), &wgrad);
    wgrad.run();
    for (int64_t i = 0; i < rows_out * n; ++i) err.y(y[i], row0 * n + i);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < kin; ++p) err.dx(dx[i * kin + p], i * k + kb + p);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < ks.count; ++p) err.dw(layer.weight.grad[j * ks.count + p], j * k + ks.begin + p);
    if (c.bias)
      for (int64_t j = 0; j < n; ++j) err.db(layer.bias.grad[j], j);
  } else {
    throw_invalid("unknown layer '{}'; use column or row", c.layer);
  }
  const std::string unit = c.bf16 ? " / bf16 bound" : "";
  ConsistencyResult res{{"forward Y" + unit, err.ey}, {"backward dX" + unit, err.edx}};
  if (!c.frozen_weight) res.emplace_back("backward dW" + unit, err.edw);
  if (c.bias && !c.frozen_weight) res.emplace_back("backward db" + unit, err.edb);
  return res;
}

}  // namespace

std::vector<float> consistency_data(int64_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

ConsistencyResult check_consistency(Communicator& tp, const ConsistencyCase& c) {
  if (c.m < 1 || c.k < 1 || c.n < 1) throw_invalid("--m, --k and --n must be >= 1 (got {}, {}, {})", c.m, c.k, c.n);
  if (c.coc.parallel_num < 1 && c.coc.parallel_num != CocOptions::kAuto)
    throw_invalid("--coc-parallel-num must be >= 1 or auto (got {}); use 1 for the plain order, 2-16 to overlap",
                  c.coc.parallel_num);
  return c.op.empty() ? check_layer(tp, c) : check_op(tp, c);
}

}  // namespace coc
