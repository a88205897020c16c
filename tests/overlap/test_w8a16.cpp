// coc-test-np: 1 2 4
// coc-test-timeout: 300
//
// w8a16 matmul_all_reduce (include/coc/overlap/w8a16.h) on real MPI ranks: each rank quantises its k-slice of a
// full weight, and the reduced output must match an fp64 GEMM on the dequantised slices within 1e-5 relative,
// for every granularity (per-group with k not a multiple of g), fp32, fp16 and bf16 activations, N in {1, 3, 4},
// both engines, bias, a strided output, the fused path and deterministic mode (bitwise equal across N); and the
// uniform errors for an int8 activation and a bad scale shape.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/core/fp16.h"
#include "coc/overlap/partition.h"
#include "coc/overlap/w8a16.h"
#include "support/expect_error.h"
#include "support/mpi_fixture.h"

namespace coc {
namespace {

using test::world_comm;

struct Problem {
  int64_t m, K, n;
  std::string spec;
  bool asym;
};

/// Rank r's quantised k-slice of the full [K, n] weight (every rank can build every slice: same seed).
Int8Weight slice_weight(const Tensor& w_full, int64_t K, int T, int r, const QuantSpec& spec, bool asym) {
  const RowRange kr = split_rows(K, T, r);
  return quantize_weight(w_full.mat().slice_rows(kr.begin, kr.count), WeightLayout::kKN, spec, asym);
}

/// fp64 reference of the whole problem: Σ_r a[:, k_r] · dequantize(w_r) + bias.
std::vector<double> reference(const Tensor& a, const Tensor& w_full, const Problem& p, int T, const float* bias,
                              const QuantSpec& spec) {
  std::vector<double> y(static_cast<size_t>(p.m * p.n), 0.0);
  for (int r = 0; r < T; ++r) {
    const RowRange kr = split_rows(p.K, T, r);
    const Tensor wd = dequantize(slice_weight(w_full, p.K, T, r, spec, p.asym));
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t q = 0; q < kr.count; ++q) {
        const double x = a.mat().row(i)[kr.begin + q];
        for (int64_t j = 0; j < p.n; ++j) y[static_cast<size_t>(i * p.n + j)] += x * wd.mat().row(q)[j];
      }
  }
  if (bias)
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t j = 0; j < p.n; ++j) y[static_cast<size_t>(i * p.n + j)] += bias[j];
  return y;
}

double rel_err(ConstMatrixView got, const std::vector<double>& ref) {
  double e = 0, s = 1e-30;
  for (int64_t i = 0; i < got.rows; ++i)
    for (int64_t j = 0; j < got.cols; ++j) {
      const double r = ref[static_cast<size_t>(i * got.cols + j)];
      e = std::max(e, std::fabs(got.row(i)[j] - r));
      s = std::max(s, std::fabs(r));
    }
  return e / s;
}

TEST(W8a16MatmulAllReduce, MatchesFp64OnTheDequantisedWeight) {
  const int T = test::world_size(), r = test::world_rank();
  // k per rank is K/T = 400/T: 400, 200 or 100, never a multiple of 64 or 96.
  const Problem problems[] = {{37, 400, 24, "per-tensor", false},  {37, 400, 24, "per-channel", true},
                              {37, 400, 24, "per-group:32", false}, {45, 400, 17, "per-group:64", true},
                              {5, 400, 8, "per-group:96", false}};
  for (EngineKind eng : {EngineKind::kInline, EngineKind::kThread}) {
    auto tp = world_comm(eng);
    for (const Problem& p : problems) {
      const QuantSpec spec = QuantSpec::parse(p.spec);
      const Tensor a = test::random_tensor({p.m, p.K}, 1);
      const Tensor w_full = test::random_tensor({p.K, p.n}, 2);
      const Tensor bias = test::random_tensor({p.n}, 3);
      const RowRange kr = split_rows(p.K, T, r);
      const Int8Weight w = slice_weight(w_full, p.K, T, r, spec, p.asym);
      // This rank's activation slice, in fp32 and rounded to fp16 (the fp16 reference uses the rounded values).
      Tensor a_loc({p.m, kr.count});
      for (int64_t i = 0; i < p.m; ++i)
        std::memcpy(a_loc.mat().row(i), a.mat().row(i) + kr.begin, static_cast<size_t>(kr.count) * 4);
      std::vector<uint16_t> a_h(static_cast<size_t>(p.m * kr.count));
      fp32_to_fp16(a_loc.data(), a_h.data(), p.m * kr.count);
      std::vector<BFloat16> a_b(static_cast<size_t>(p.m * kr.count));
      fp32_to_bf16(a_loc.data(), a_b.data(), p.m * kr.count);
      Tensor a16_full({p.m, p.K}), ab_full({p.m, p.K});
      {
        std::vector<uint16_t> tmp(static_cast<size_t>(p.m * p.K));
        fp32_to_fp16(a.data(), tmp.data(), p.m * p.K);
        fp16_to_fp32(tmp.data(), a16_full.data(), p.m * p.K);
        std::copy_n(a.data(), p.m * p.K, ab_full.data());
        round_to_bf16(ab_full.data(), p.m * p.K);
      }
      for (DType t : {DType::kF32, DType::kF16, DType::kBF16})
        for (bool with_bias : {false, true}) {
          const float* b = with_bias ? bias.data() : nullptr;
          const auto ref = reference(t == DType::kF16 ? a16_full : t == DType::kBF16 ? ab_full : a, w_full, p, T, b,
                                     spec);
          const ActivationView av = t == DType::kF16    ? ActivationView::f16(a_h.data(), p.m, kr.count, kr.count)
                                    : t == DType::kBF16 ? ActivationView::bf16(a_b.data(), p.m, kr.count, kr.count)
                                                        : ActivationView::f32(a_loc.mat());
          const char* f16 = to_string(t);
          for (int N : {1, 3, 4}) {
            CocOptions o;
            o.parallel_num = N;
            CocStats st;
            o.stats = &st;
            Tensor out({p.m, p.n});
            w8a16_matmul_all_reduce(*tp, av, w, out.mat(), b, o);
            EXPECT_LE(rel_err(out.mat(), ref), 1e-5)
                << p.spec << " m=" << p.m << " dtype=" << f16 << " bias=" << with_bias << " N=" << N;
            EXPECT_EQ(st.calls, 1);
          }
          // The fused shared-memory path (CocOptions::fused): the same result within 1e-5.
          {
            CocOptions o;
            o.parallel_num = 2;
            o.fused = true;
            Tensor out({p.m, p.n});
            w8a16_matmul_all_reduce(*tp, av, w, out.mat(), b, o);
            EXPECT_LE(rel_err(out.mat(), ref), 1e-5) << p.spec << " fused dtype=" << f16;
          }
          // strided output
          Tensor wide({p.m, p.n + 5});
          CocOptions o;
          o.parallel_num = 2;
          w8a16_matmul_all_reduce(*tp, av, w, wide.mat().slice_cols(2, p.n), b, o);
          EXPECT_LE(rel_err(wide.mat().slice_cols(2, p.n), ref), 1e-5) << p.spec << " strided";
        }
    }
  }
}

TEST(W8a16MatmulAllReduce, DeterministicModeIsBitwiseEqualAcrossN) {
  const int T = test::world_size(), r = test::world_rank();
  auto tp = world_comm();
  const int64_t m = 300, K = 512, n = 40;
  const Tensor a = test::random_tensor({m, K}, 4);
  const Tensor w_full = test::random_tensor({K, n}, 5);
  const RowRange kr = split_rows(K, T, r);
  const Int8Weight w = quantize_weight(w_full.mat().slice_rows(kr.begin, kr.count), WeightLayout::kKN,
                                       QuantSpec::parse("per-group:64"), true);
  const ConstMatrixView a_loc = a.mat().slice_cols(kr.begin, kr.count);
  Tensor first({m, n});
  for (int N : {1, 2, 4, 7}) {
    CocOptions o;
    o.parallel_num = N;
    o.deterministic = true;
    Tensor out({m, n});
    w8a16_matmul_all_reduce(*tp, ActivationView::f32(a_loc), w, out.mat(), nullptr, o);
    if (N == 1)
      first = out;
    else
      EXPECT_EQ(std::memcmp(first.data(), out.data(), static_cast<size_t>(m * n) * 4), 0) << "N=" << N;
    // CocOptions::produce_rows: a NaN copy of a whose rows are filled on request gives the same bits, and a
    // chunked call asks for its rows in pieces.
    Tensor late({m, kr.count});
    late.fill(std::numeric_limits<float>::quiet_NaN());
    std::vector<char> done(static_cast<size_t>(m), 0);
    int64_t first_request = -1;
    o.produce_rows = [&](RowRange rows) {
      if (first_request < 0) first_request = rows.count;
      for (int64_t i = rows.begin; i < rows.end(); ++i)
        if (!done[static_cast<size_t>(i)]) {
          done[static_cast<size_t>(i)] = 1;
          std::copy(a_loc.row(i), a_loc.row(i) + kr.count, late.mat().row(i));
        }
    };
    Tensor produced({m, n});
    w8a16_matmul_all_reduce(*tp, ActivationView::f32(late.mat()), w, produced.mat(), nullptr, o);
    EXPECT_EQ(std::memcmp(first.data(), produced.data(), static_cast<size_t>(m * n) * 4), 0) << "produced, N=" << N;
    EXPECT_EQ(std::count(done.begin(), done.end(), 1), m) << "N=" << N;
    if (N > 2) EXPECT_LT(first_request, m) << "N=" << N;
  }
}

TEST(W8a16MatmulAllReduce, BadDtypeAndScaleShapeAreUniformErrors) {
  auto tp = world_comm();
  Tensor w_full = test::random_tensor({128, 8}, 6);
  Int8Weight w = quantize_weight(w_full.mat(), WeightLayout::kKN, QuantSpec::parse("per-channel"), false);
  std::vector<uint16_t> x(4 * 128);
  Tensor out({4, 8});
  CocOptions o;
  Error e = test::expect_error([&] {
    w8a16_matmul_all_reduce(*tp, ActivationView{x.data(), DType::kInt8, 4, 128, 128}, w, out.mat(), nullptr, o);
  });
  EXPECT_TRUE(e.uniform());
  EXPECT_NE(std::string(e.what()).find("int8 is not supported"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("w8a16_matmul_all_reduce"), std::string::npos) << e.what();
  w.scale.resize(3);
  Tensor a({4, 128});
  e = test::expect_error(
      [&] { w8a16_matmul_all_reduce(*tp, ActivationView::f32(a.mat()), w, out.mat(), nullptr, o); });
  EXPECT_NE(std::string(e.what()).find("scale has 3 values"), std::string::npos) << e.what();
}

}  // namespace
}  // namespace coc
