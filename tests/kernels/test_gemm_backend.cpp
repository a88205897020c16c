// The GEMM back ends (coc/kernels/gemm.h): oneDNN and OpenBLAS against an fp64 reference on awkward shapes (one
// row, sizes of no vector width, padded leading dimensions, both transposes, alpha and beta), oneDNN's same bits for
// a row whatever block of rows a call covers, empty problems, the
// primitive cache, and bf16 × bf16 GEMMs against the exact product of the bf16 inputs with a bound derived from k.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/kernels/gemm.h"
#include "kernel_test_util.h"

namespace coc {
namespace {

constexpr double kU32 = 0x1p-24;  // fp32 unit roundoff

/// Restores the process's back end when a test that switches it ends.
struct BackendGuard {
  GemmBackend saved = gemm_backend();
  ~BackendGuard() { set_gemm_backend(saved); }
};

/// A [rows, cols] matrix with leading dimension cols + pad, filled with U(-1, 1).
struct Padded {
  std::vector<float> buf;
  MatrixView v;
  Padded(int64_t rows, int64_t cols, int64_t pad, uint32_t seed)
      : buf(test::uniform_vec(std::max<int64_t>(rows, 1) * (cols + pad), seed)),
        v{buf.data(), rows, cols, cols + pad} {}
};

/// |c - (alpha·op(a)·op(b) + beta·c0)| per element against its bound: fp32 accumulation over k terms errs by at most
/// γ_k·Σ|a·b| with γ_k = k·u/(1 - k·u) (Higham, Accuracy and Stability, §3.1), plus the rounding of alpha and beta's
/// products and the sum (3u of the magnitude). Returns the largest error / bound.
double worst_ratio(ConstMatrixView a, bool ta, ConstMatrixView b, bool tb, ConstMatrixView c0, ConstMatrixView c,
                   float alpha, float beta, double u = kU32) {
  const int64_t m = c.rows, n = c.cols, k = ta ? a.rows : a.cols;
  auto A = [&](int64_t i, int64_t p) { return static_cast<double>(ta ? a.row(p)[i] : a.row(i)[p]); };
  auto B = [&](int64_t p, int64_t j) { return static_cast<double>(tb ? b.row(j)[p] : b.row(p)[j]); };
  const double gamma = (k + 3) * u / (1 - (k + 3) * u);
  double worst = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double exact = 0, mag = 0;
      for (int64_t p = 0; p < k; ++p) {
        exact += A(i, p) * B(p, j);
        mag += std::abs(A(i, p) * B(p, j));
      }
      exact = alpha * exact + beta * static_cast<double>(c0.row(i)[j]);
      const double bound = gamma * (std::abs(alpha) * mag + std::abs(beta * c0.row(i)[j])) + 1e-30;
      worst = std::max(worst, std::abs(c.row(i)[j] - exact) / bound);
    }
  return worst;
}

class Backends : public ::testing::TestWithParam<GemmBackend> {
 protected:
  void SetUp() override { set_gemm_backend(GetParam()); }
  BackendGuard guard_;
};

INSTANTIATE_TEST_SUITE_P(Gemm, Backends, ::testing::Values(GemmBackend::kOneDnn, GemmBackend::kOpenBlas),
                         [](const auto& i) { return std::string(to_string(i.param)); });

TEST_P(Backends, MatchesTheFp64ReferenceOnAwkwardShapes) {
  struct Shape { int64_t m, k, n; };
  const Shape shapes[] = {{1, 1, 1}, {1, 37, 5}, {7, 13, 5}, {33, 17, 65}, {130, 96, 70}};
  const std::pair<float, float> scales[] = {{1.0f, 0.0f}, {0.5f, 1.0f}, {-1.5f, 2.0f}};
  uint32_t seed = 1;
  for (const Shape& s : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (auto [alpha, beta] : scales) {
          Padded a(ta ? s.k : s.m, ta ? s.m : s.k, 3, seed++), b(tb ? s.n : s.k, tb ? s.k : s.n, 1, seed++);
          Padded c(s.m, s.n, 2, seed++);
          const std::vector<float> c0buf = c.buf;
          const ConstMatrixView c0{c0buf.data(), s.m, s.n, c.v.ld};
          gemm(a.v, ta, b.v, tb, c.v, alpha, beta);
          EXPECT_LE(worst_ratio(a.v, ta, b.v, tb, c0, c.v, alpha, beta), 1.0)
              << "m " << s.m << " k " << s.k << " n " << s.n << " ta " << ta << " tb " << tb << " alpha " << alpha
              << " beta " << beta;
        }
}

// oneDNN's promise only: OpenBLAS's bits depend on the block (gemm.h), which deterministic mode's tiles absorb.
TEST(GemmOneDnn, ARowHasTheSameBitsInEveryBlockOfRows) {
  BackendGuard guard;
  set_gemm_backend(GemmBackend::kOneDnn);
  const int64_t m = 97, k = 131, n = 75;
  for (WeightLayout layout : {WeightLayout::kNK, WeightLayout::kKN}) {
    Tensor x({m, k}), w(layout == WeightLayout::kNK ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n});
    test::fill_uniform(x.mat(), 11);
    test::fill_uniform(w.mat(), 12);
    Tensor whole({m, n}), parts({m, n});
    matmul(x.mat(), w.mat(), layout, whole.mat());
    for (auto [begin, count] : {std::pair<int64_t, int64_t>{0, 13}, {13, 1}, {14, 36}, {50, 47}})
      matmul(x.mat().slice_rows(begin, count), w.mat(), layout, parts.mat().slice_rows(begin, count));
    EXPECT_EQ(std::memcmp(whole.data(), parts.data(), sizeof(float) * m * n), 0) << to_string(layout);
  }
}

// Padded leading dimensions must not change the bits either: deterministic mode stores the same rows through views
// of different strides (oneDNN itself would switch kernels; gemm_onednn.cpp packs such operands).
TEST(GemmOneDnn, LeadingDimensionsDoNotChangeTheBits) {
  BackendGuard guard;
  set_gemm_backend(GemmBackend::kOneDnn);
  const int64_t m = 5, k = 40, n = 72;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f}) {
        Padded a0(ta ? k : m, ta ? m : k, 0, 21), b0(tb ? n : k, tb ? k : n, 0, 22), c0(m, n, 0, 23);
        Padded a1(ta ? k : m, ta ? m : k, 3, 21), b1(tb ? n : k, tb ? k : n, 5, 22), c1(m, n, 7, 23);
        for (int64_t i = 0; i < a0.v.rows; ++i) std::copy_n(a0.v.row(i), a0.v.cols, a1.v.row(i));
        for (int64_t i = 0; i < b0.v.rows; ++i) std::copy_n(b0.v.row(i), b0.v.cols, b1.v.row(i));
        for (int64_t i = 0; i < m; ++i) std::copy_n(c0.v.row(i), n, c1.v.row(i));
        const std::vector<float> before = c1.buf;
        gemm(a0.v, ta, b0.v, tb, c0.v, 1.0f, beta);
        gemm(a1.v, ta, b1.v, tb, c1.v, 1.0f, beta);
        for (int64_t i = 0; i < m; ++i) {
          ASSERT_EQ(std::memcmp(c0.v.row(i), c1.v.row(i), sizeof(float) * n), 0)
              << "row " << i << " ta " << ta << " tb " << tb << " beta " << beta;
          for (int64_t j = n; j < c1.v.ld && i + 1 < m; ++j)
            ASSERT_EQ(c1.v.row(i)[j], before[static_cast<size_t>(i * c1.v.ld + j)]) << "wrote into c's padding";
        }
      }
}

TEST_P(Backends, EmptyProblems) {
  Tensor a({0, 4}), b({4, 3}), c({0, 3});
  gemm(a.mat(), false, b.mat(), false, c.mat());  // m = 0: nothing to do
  Tensor a2({2, 0}), b2({0, 3}), c2({2, 3});
  c2.fill(4.0f);
  gemm(a2.mat(), false, b2.mat(), false, c2.mat(), 1.0f, 0.5f);  // k = 0: c = beta · c
  for (int64_t i = 0; i < c2.numel(); ++i) EXPECT_EQ(c2[i], 2.0f);
  gemm(a2.mat(), false, b2.mat(), false, c2.mat());
  for (int64_t i = 0; i < c2.numel(); ++i) EXPECT_EQ(c2[i], 0.0f);
}

TEST_P(Backends, MismatchedShapesAreAnInternalError) {
  Tensor a({3, 4}), b({5, 2}), c({3, 2});
  try {
    gemm(a.mat(), false, b.mat(), false, c.mat());
    FAIL() << "k 4 against 5 must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_NE(std::string(e.what()).find("op(a) [3, 4], op(b) [5, 2]"), std::string::npos) << e.what();
  }
}

TEST(GemmBackend, NamesAndAuto) {
  BackendGuard guard;
  EXPECT_EQ(parse_gemm_backend("onednn"), GemmBackend::kOneDnn);
  EXPECT_EQ(parse_gemm_backend("openblas"), GemmBackend::kOpenBlas);
  set_gemm_backend(GemmBackend::kAuto);
  EXPECT_NE(gemm_backend(), GemmBackend::kAuto) << "auto resolves at once";
  try {
    parse_gemm_backend("mkl");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("--gemm-backend 'mkl'"), std::string::npos) << e.what();
  }
  const OneDnnInfo info = onednn_info();
  EXPECT_FALSE(info.version.empty());
  EXPECT_FALSE(info.f32_kernel.empty()) << "oneDNN always has an fp32 matmul";
}

TEST(GemmBackend, ASteadyShapeCreatesNoPrimitive) {
  BackendGuard guard;
  set_gemm_backend(GemmBackend::kOneDnn);
  Tensor a({9, 10}), b({10, 11}), c({9, 11});
  gemm(a.mat(), false, b.mat(), false, c.mat());
  const int64_t before = onednn_primitives_created();
  for (int i = 0; i < 3; ++i) gemm(a.mat(), false, b.mat(), false, c.mat());
  EXPECT_EQ(onednn_primitives_created(), before);
  gemm(a.mat().slice_rows(0, 4), false, b.mat(), false, c.mat().slice_rows(0, 4));
  EXPECT_EQ(onednn_primitives_created(), before + 1) << "another m is another problem";
}

/// bf16 copies of an fp32 matrix, and the fp32 values of those copies (the exact inputs of the bf16 GEMM).
struct Bf16Matrix {
  std::vector<BFloat16> h;
  std::vector<float> f;
  int64_t rows, cols;
  Bf16Matrix(int64_t r, int64_t c, uint32_t seed) : h(r * c), f(test::uniform_vec(r * c, seed)), rows(r), cols(c) {
    fp32_to_bf16(f.data(), h.data(), r * c);
    bf16_to_fp32(h.data(), f.data(), r * c);
  }
  ConstBf16View view() const { return {h.data(), rows, cols, cols}; }
  ConstMatrixView fview() const { return {f.data(), rows, cols, cols}; }
};

TEST(GemmBf16, MatchesTheExactProductOfTheRoundedInputs) {
  if (onednn_info().bf16_kernel.empty()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  struct Shape { int64_t m, k, n; };
  uint32_t seed = 100;
  for (const Shape& s : {Shape{1, 1, 1}, Shape{5, 67, 3}, Shape{64, 256, 96}, Shape{33, 1000, 17}})
    for (bool tb : {false, true}) {
      Bf16Matrix a(s.m, s.k, seed++), b(tb ? s.n : s.k, tb ? s.k : s.n, seed++);
      Tensor c({s.m, s.n}), zero({s.m, s.n});
      gemm(a.view(), false, b.view(), tb, c.mat());
      // The products of bf16 values are exact in fp32 (8 + 8 significant bits); only the fp32 sums round.
      EXPECT_LE(worst_ratio(a.fview(), false, b.fview(), tb, zero.mat(), c.mat(), 1.0f, 0.0f), 1.0)
          << s.m << "x" << s.k << "x" << s.n << " tb " << tb;
      // bf16 output: one more rounding, u = 2^-8 of the result (plus the fp32 accumulation above).
      std::vector<BFloat16> ch(static_cast<size_t>(s.m * s.n));
      gemm(a.view(), false, b.view(), tb, Bf16View{ch.data(), s.m, s.n, s.n});
      for (int64_t i = 0; i < s.m * s.n; ++i) {
        const float got = bf16_to_float(ch[static_cast<size_t>(i)]);
        EXPECT_LE(std::abs(got - c[i]), 0x1p-8 * std::abs(c[i]) + 1e-30) << i;
      }
    }
}

TEST(GemmBf16, AccumulatesAndScales) {
  if (onednn_info().bf16_kernel.empty()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  Bf16Matrix x(6, 40, 7), w(9, 40, 8);  // Megatron's [out, in] weight
  Tensor y({6, 9}), ref({6, 9});
  y.fill(1.0f);
  matmul(x.view(), w.view(), WeightLayout::kNK, y.mat(), /*accumulate=*/true);
  matmul(x.fview(), w.fview(), WeightLayout::kNK, ref.mat());
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_NEAR(y[i], ref[i] + 1.0f, 1e-5f) << i;
}

/// Restores the process's compute type when a test that switches it ends.
struct ComputeGuard {
  DType saved = gemm_compute_type();
  ~ComputeGuard() { set_gemm_compute_type(saved); }
};

TEST(GemmComputeType, Bf16RoundsTheFp32OperandsAndNothingElse) {
  if (onednn_info().bf16_kernel.empty()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  ComputeGuard guard;
  // Padded operands, both transposes, alpha and beta: the fp32 call under kBF16 must give the bits of the bf16
  // GEMM of the rounded operands, and so stay within the bound of the exact product of those operands.
  for (bool tb : {false, true}) {
    Padded a(13, 70, 3, 21), b(tb ? 9 : 70, tb ? 70 : 9, 2, 22), c0(13, 9, 1, 23);
    Bf16Matrix ar(13, 70, 0), br(tb ? 9 : 70, tb ? 70 : 9, 0);
    for (int64_t i = 0; i < 13; ++i) fp32_to_bf16(a.v.row(i), ar.h.data() + i * 70, 70);
    for (int64_t i = 0; i < br.rows; ++i) fp32_to_bf16(b.v.row(i), br.h.data() + i * br.cols, br.cols);
    bf16_to_fp32(ar.h.data(), ar.f.data(), 13 * 70);
    bf16_to_fp32(br.h.data(), br.f.data(), br.rows * br.cols);
    Tensor got({13, 9}), want({13, 9});
    for (int64_t i = 0; i < 13; ++i)
      for (int64_t j = 0; j < 9; ++j) got[i * 9 + j] = want[i * 9 + j] = c0.v.row(i)[j];
    set_gemm_compute_type(DType::kBF16);
    EXPECT_EQ(gemm_compute_type(), DType::kBF16);
    gemm(a.v, false, b.v, tb, got.mat(), 0.5f, 2.0f);
    gemm(ar.view(), false, br.view(), tb, want.mat(), 0.5f, 2.0f);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * 117), 0) << "tb " << tb;
    EXPECT_LE(worst_ratio(ar.fview(), false, br.fview(), tb, c0.v, got.mat(), 0.5f, 2.0f), 1.0) << "tb " << tb;
  }
}

TEST(GemmComputeType, ScopesNestAndTheRestIsRefused) {
  ComputeGuard guard;
  set_gemm_compute_type(DType::kBF16);
  {
    GemmComputeScope fp32(DType::kF32);  // the router's island
    EXPECT_EQ(gemm_compute_type(), DType::kF32);
    {
      GemmComputeScope inner(DType::kBF16);
      EXPECT_EQ(gemm_compute_type(), DType::kBF16);
    }
    EXPECT_EQ(gemm_compute_type(), DType::kF32);
  }
  EXPECT_EQ(gemm_compute_type(), DType::kBF16);
  EXPECT_THROW(set_gemm_compute_type(DType::kInt8), Error);
  // store_as_compute_type rounds a strided view's own elements only.
  std::vector<float> y = {1.0f + 0x1p-9f, 7.0f, 1.0f + 0x1p-9f, 7.0f};
  store_as_compute_type(MatrixView{y.data(), 2, 1, 2});
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[3], 7.0f);
  EXPECT_EQ(y[2], 1.0f);
  set_gemm_compute_type(DType::kF32);
  y[0] = 1.0f + 0x1p-9f;
  store_as_compute_type(MatrixView{y.data(), 1, 1, 1});
  EXPECT_EQ(y[0], 1.0f + 0x1p-9f) << "fp32 stores what it computed";
}

TEST(GemmWeightCopies, AWeightReadFromItsCopyGivesTheSameBitsAndAWriteAfterwardsIsSeen) {
  if (onednn_info().bf16_kernel.empty()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  ComputeGuard guard;
  set_gemm_compute_type(DType::kBF16);
  // w: a padded [40, 24] weight; views of it: whole, a column slice (strided), a row slice, transposed.
  Padded w(40, 24, 5, 51), x(7, 40, 0, 52), xt(7, 24, 0, 53);
  auto products = [&] {
    std::vector<Tensor> out;
    out.emplace_back(std::vector<int64_t>{7, 24});
    gemm(x.v, false, w.v, false, out.back().mat());
    out.emplace_back(std::vector<int64_t>{7, 10});
    gemm(x.v, false, w.v.slice_cols(3, 10), false, out.back().mat());
    out.emplace_back(std::vector<int64_t>{7, 24});
    gemm(x.v.slice_cols(0, 17), false, w.v.slice_rows(5, 17), false, out.back().mat());
    out.emplace_back(std::vector<int64_t>{7, 40});
    gemm(xt.v, false, w.v, true, out.back().mat());
    return out;
  };
  const std::vector<Tensor> want = products();
  {
    const GemmWeightCopies copies({std::span<const float>(w.buf)});
    EXPECT_THROW(GemmWeightCopies({}), Error) << "one instance at a time";
    for (int pass = 0; pass < 2; ++pass) {  // the second pass reads the copy made by the first
      const std::vector<Tensor> got = products();
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), sizeof(float) * want[i].numel()), 0) << i;
    }
  }
  w.v.row(0)[0] += 1.0f;  // the optimizer's step: the next iteration must see it
  const GemmWeightCopies next({std::span<const float>(w.buf)});
  const std::vector<Tensor> got = products();
  EXPECT_NE(std::memcmp(got[0].data(), want[0].data(), sizeof(float) * want[0].numel()), 0);
}

// GemmOperandCopy: an activation read by several GEMMs (dY: transposed for dW, row-sliced for the CoC chunks'
// dX, strided) gives the bits of rounding it on every read, nested copies each serve their own buffer, and the copy
// ends with its instance (a write afterwards is seen). The mixed bf16/fp32 forms give the bits of the fp32 form.
TEST(GemmOperandCopy, AnActivationReadFromItsCopyGivesTheSameBits) {
  if (onednn_info().bf16_kernel.empty()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  ComputeGuard guard;
  set_gemm_compute_type(DType::kBF16);
  Padded dy(30, 12, 3, 61), x(30, 9, 0, 62), w(12, 9, 0, 63), other(30, 5, 2, 64);
  auto products = [&] {
    std::vector<Tensor> out;
    out.emplace_back(std::vector<int64_t>{12, 9});
    gemm(dy.v, true, x.v, false, out.back().mat());  // dW = dYᵀ·X
    out.emplace_back(std::vector<int64_t>{11, 9});
    gemm(dy.v.slice_rows(7, 11), false, w.v, false, out.back().mat());  // one chunk's dX
    out.emplace_back(std::vector<int64_t>{12, 5});
    gemm(dy.v, true, other.v, false, out.back().mat());  // a second activation, in a nested copy
    return out;
  };
  auto same = [](const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    for (size_t i = 0; i < a.size(); ++i)
      if (std::memcmp(a[i].data(), b[i].data(), sizeof(float) * a[i].numel()) != 0) return false;
    return true;
  };
  const std::vector<Tensor> want = products();
  {
    const GemmOperandCopy outer(dy.v);
    const GemmOperandCopy inner(other.v);
    EXPECT_TRUE(same(products(), want));
    EXPECT_TRUE(same(products(), want)) << "the second read, from the copies made by the first";
  }
  dy.v.row(0)[0] += 1.0f;
  EXPECT_FALSE(same(products(), want)) << "a write after the copy's end must be seen";
  // The mixed forms: bf16 X (kept) or bf16 dY (kept) against the fp32 operand rounded as gemm() rounds it.
  std::vector<BFloat16> x16(30 * 9), dy16(30 * 12);
  for (int64_t i = 0; i < 30; ++i) {
    fp32_to_bf16(x.v.row(i), x16.data() + i * 9, 9);
    fp32_to_bf16(dy.v.row(i), dy16.data() + i * 12, 12);
  }
  Tensor ref({12, 9}), got({12, 9});
  gemm(dy.v, true, x.v, false, ref.mat());
  gemm(dy.v, true, ConstBf16View{x16.data(), 30, 9, 9}, false, got.mat());
  EXPECT_EQ(std::memcmp(ref.data(), got.data(), sizeof(float) * ref.numel()), 0) << "fp32 dY, bf16 X";
  gemm(ConstBf16View{dy16.data(), 30, 12, 12}, true, x.v, false, got.mat());
  EXPECT_EQ(std::memcmp(ref.data(), got.data(), sizeof(float) * ref.numel()), 0) << "bf16 dY, fp32 X";
  set_gemm_compute_type(DType::kF32);
  const GemmOperandCopy none(dy.v);  // nothing under fp32
  Tensor f32({12, 9});
  gemm(dy.v, true, x.v, false, f32.mat());
  EXPECT_NE(std::memcmp(ref.data(), f32.data(), sizeof(float) * ref.numel()), 0) << "fp32 must not read a copy";
}

// GemmOperandCopy's rows: one written by a producer after the copy was made, but before a GEMM read it, is read
// with its new value (rows are rounded at their first read); one read already keeps the value of that read (the
// contract forbids the write; the test shows which value a GEMM sees); rows filled by their producer are read as
// filled, also by a GEMM inside a nested copy of the same activation (which does nothing); a view reaching past the
// copy's columns is rounded as a plain operand.
TEST(GemmOperandCopy, RowsAreRoundedAtTheirFirstReadOrFilledByTheirProducer) {
  if (onednn_info().bf16_kernel.empty()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  ComputeGuard guard;
  set_gemm_compute_type(DType::kBF16);
  Padded dy(20, 12, 4, 81), w(16, 7, 0, 82);
  const auto product = [&](ConstMatrixView rows) {  // rows · w[:cols], as gemm() computes it
    Tensor out({rows.rows, 7});
    gemm(rows, false, w.v.slice_rows(0, rows.cols), false, out.mat());
    return out;
  };
  const auto rounded_product = [&](ConstMatrixView rows) {  // the same from the rows rounded here
    std::vector<BFloat16> r16(static_cast<size_t>(rows.rows * rows.cols));
    fp32_to_bf16_rows(rows.data, rows.ld, r16.data(), rows.cols, rows.rows, rows.cols);
    Tensor out({rows.rows, 7});
    gemm(ConstBf16View{r16.data(), rows.rows, rows.cols, rows.cols}, false, w.v.slice_rows(0, rows.cols), false,
         out.mat());
    return out;
  };
  const auto same = [](const Tensor& a, const Tensor& b) {
    return std::memcmp(a.data(), b.data(), sizeof(float) * a.numel()) == 0;
  };
  GemmOperandCopy copy(dy.v);
  const Tensor first = product(dy.v.slice_rows(0, 5));
  EXPECT_TRUE(same(first, rounded_product(dy.v.slice_rows(0, 5))));
  dy.v.row(8)[3] = 0.5f;  // produced after the copy was made, before any read
  EXPECT_TRUE(same(product(dy.v.slice_rows(5, 5)), rounded_product(dy.v.slice_rows(5, 5))));
  dy.v.row(2)[0] = 0.25f;  // after its row was read: the copy keeps the value read
  EXPECT_TRUE(same(product(dy.v.slice_rows(0, 5)), first));
  EXPECT_FALSE(same(first, rounded_product(dy.v.slice_rows(0, 5))));
  // Rows 10..14 filled with the bf16 values of other numbers: the GEMMs read those.
  Padded other(5, 12, 4, 83);
  const MatrixViewT<BFloat16> f = copy.fill_rows(10, 5);
  ASSERT_EQ(f.rows, 5);
  ASSERT_EQ(f.cols, 12);
  fp32_to_bf16_rows(other.v.data, other.v.ld, f.data, f.ld, 5, 12);
  {
    GemmOperandCopy nested(dy.v.slice_rows(10, 5));  // inside the enclosing copy: it does nothing
    EXPECT_EQ(nested.fill_rows(0, 5).data, nullptr);
    EXPECT_TRUE(same(product(dy.v.slice_rows(10, 5)), rounded_product(other.v)));
    EXPECT_TRUE(same(product(dy.v.slice_rows(10, 5).slice_cols(4, 8)), rounded_product(other.v.slice_cols(4, 8))))
        << "a column slice of filled rows";
  }
  const ConstMatrixView past{dy.v.data + 15 * 16, 3, 16, 16};  // rows 15..17 with their padding
  EXPECT_TRUE(same(product(past), rounded_product(past)));
  EXPECT_THROW(copy.fill_rows(18, 3), Error) << "rows past the activation";
}

TEST(GemmComputeType, Fp16MultipliesFp16ValuesOnTheFp32Kernels) {
  ComputeGuard guard;
  Padded a(9, 33, 2, 41), b(33, 7, 0, 42);
  for (int64_t i = 0; i < 9; ++i) a.v.row(i)[0] = 70000.0f;  // beyond fp16's 65504: inf, as an fp16 tensor holds
  Tensor got({9, 7}), want({9, 7});
  std::vector<float> ar(9 * 33), br(33 * 7);
  for (int64_t i = 0; i < 9; ++i) std::copy(a.v.row(i), a.v.row(i) + 33, ar.begin() + i * 33);
  std::copy(b.buf.begin(), b.buf.begin() + 33 * 7, br.begin());
  round_to_half(DType::kF16, ar.data(), 9 * 33);
  round_to_half(DType::kF16, br.data(), 33 * 7);
  gemm(ConstMatrixView{ar.data(), 9, 33, 33}, false, ConstMatrixView{br.data(), 33, 7, 7}, false, want.mat());
  set_gemm_compute_type(DType::kF16);
  gemm(a.v, false, b.v, false, got.mat());
  for (int64_t i = 0; i < 9 * 7; ++i) {
    if (std::isnan(want[i]))
      EXPECT_TRUE(std::isnan(got[i])) << i;
    else
      EXPECT_EQ(got[i], want[i]) << i;
  }
  EXPECT_TRUE(std::isinf(ar[0])) << "the overflow --fp16's loss scaling watches for";
}

TEST(GemmComputeType, Bf16RowsHaveTheSameBitsInEveryBlockOfRows) {
  if (onednn_info().bf16_kernel.empty()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU";
  ComputeGuard guard;
  set_gemm_compute_type(DType::kBF16);
  Padded a(97, 64, 0, 31), w(48, 64, 0, 32);
  Tensor whole({97, 48}), part({13, 48});
  matmul(a.v, w.v, WeightLayout::kNK, whole.mat());
  matmul(a.v.slice_rows(40, 13), w.v, WeightLayout::kNK, part.mat());
  EXPECT_EQ(std::memcmp(whole.data() + 40 * 48, part.data(), sizeof(float) * 13 * 48), 0)
      << "deterministic mode and the CoC chunks rely on a row's bits not depending on its block";
}

TEST(GemmComputeType, Bf16OutputHasTheBitsOfTheFp32OutputRounded) {
  // What a bf16 reduce-scatter of the product sends (overlap/matmul_reduce_scatter.cpp): written by the GEMM
  // directly, it must be the fp32 form's result rounded, in every compute type, layout and row count (the CoC
  // chunks' sub-blocks), and from a padded x.
  ComputeGuard guard;
  std::vector<DType> types{DType::kF32, DType::kF16};
  if (!onednn_info().bf16_kernel.empty()) types.push_back(DType::kBF16);
  for (DType t : types)
    for (WeightLayout l : {WeightLayout::kNK, WeightLayout::kKN})
      for (int64_t m : {1, 7, 64, 200}) {
        set_gemm_compute_type(t);
        Padded x(m, 136, 5, 41), w(l == WeightLayout::kNK ? 96 : 136, l == WeightLayout::kNK ? 136 : 96, 0, 42);
        Tensor wide({m, 96});
        matmul(x.v, w.v, l, wide.mat());
        std::vector<BFloat16> want(static_cast<size_t>(m * 96)), got(want.size());
        fp32_to_bf16(wide.data(), want.data(), m * 96);
        matmul(x.v, w.v, l, Bf16View{got.data(), m, 96, 96});
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(BFloat16)), 0)
            << to_string(t) << " " << to_string(l) << " m " << m;
      }
}

}  // namespace
}  // namespace coc
