// Shared helpers for MPI tests: world info, a process-group factory, fp64 reference GEMM and error norms.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "coc/comm/communicator.h"
#include "coc/comm/process.h"
#include "coc/core/tensor.h"

namespace coc::test {

using ::coc::world_rank;
using ::coc::world_size;

/// A communicator over the whole world with its own engine.
inline std::unique_ptr<Communicator> world_comm(EngineKind kind = EngineKind::kInline, int timeout_ms = 60000) {
  CommOptions o;
  o.engine = kind;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  return Communicator::world("world", std::make_shared<ProgressEngine>(kind, 100), o);
}

/// Deterministic, well-conditioned data in [-1, 1): identical on every rank for the same seed.
inline Tensor random_tensor(std::vector<int64_t> shape, uint64_t seed) {
  Tensor t(std::move(shape));
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = d(g);
  return t;
}

/// Max relative error of `got` against an fp64 reference: max|got - ref| / max(max|ref|, tiny).
inline double max_rel_error(const float* got, const double* ref, int64_t n) {
  double err = 0, scale = 1e-30;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return err / scale;
}

/// fp64 reference y[m,n] = x[m,k] · W (+ bias), W under `layout` ([n,k] if nk else [k,n]).
inline std::vector<double> ref_matmul(const float* x, int64_t m, int64_t k, const float* w, int64_t n, bool nk,
                                      const float* bias = nullptr) {
  std::vector<double> y(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = bias ? bias[j] : 0.0;
      for (int64_t p = 0; p < k; ++p) s += static_cast<double>(x[i * k + p]) * (nk ? w[j * k + p] : w[p * n + j]);
      y[static_cast<size_t>(i * n + j)] = s;
    }
  return y;
}

}  // namespace coc::test
