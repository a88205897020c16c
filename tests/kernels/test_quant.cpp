// w8a16 kernels (quant.h, fp16.h): the fp16 converters (F16C against the scalar reference, bit for bit), the
// quantiser for every granularity (error <= scale/2, symmetric and asymmetric), the int8-weight panel GEMM
// against an fp64 GEMM on the dequantised weight (within 1e-5 relative; fp32 and fp16 activations, k not a
// multiple of g, several panel sizes, dequantise-all, accumulate) and the uniform errors for bad group sizes,
// scale/offset shapes and dtypes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/core/fp16.h"
#include "coc/kernels/quant.h"
#include "kernel_test_util.h"
#include "support/expect_error.h"

namespace coc {
namespace {

using test::expect_error;
using test::fill_uniform;

/// fp64 y[m, n] = x[m, k] · w[k, n].
std::vector<double> ref_matmul_kn(const float* x, int64_t m, int64_t k, const float* w, int64_t n) {
  std::vector<double> y(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) {
      const double a = x[i * k + p];
      for (int64_t j = 0; j < n; ++j) y[static_cast<size_t>(i * n + j)] += a * w[p * n + j];
    }
  return y;
}

/// max |got − ref| / max |ref|.
double rel_err(const float* got, const std::vector<double>& ref) {
  double e = 0, s = 1e-30;
  for (size_t i = 0; i < ref.size(); ++i) {
    e = std::max(e, std::fabs(got[i] - ref[i]));
    s = std::max(s, std::fabs(ref[i]));
  }
  return e / s;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

TEST(Fp16, ScalarRoundTripsEveryHalf) {
  // Every non-NaN half converts to fp32 and back unchanged (the fp32 value is exact).
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) continue;  // NaN payloads
    const float f = fp16_to_float(static_cast<uint16_t>(h));
    ASSERT_EQ(float_to_fp16(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(Fp16, KnownValuesAndRounding) {
  EXPECT_EQ(fp16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_float(0xc000), -2.0f);
  EXPECT_EQ(fp16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);                // rounds up to inf
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie, to even (down)
  EXPECT_EQ(float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, to even (up)
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);   // tie between 0 and the smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(float_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
}

TEST(Fp16, BulkMatchesScalarBitForBit) {
  // Whatever the bulk path is (F16C here when the CPU has it), it must give the scalar reference's bits, including
  // the tail that is not a multiple of 8.
  std::vector<float> src;
  for (int e = -30; e <= 17; ++e)
    for (float m : {1.0f, 1.0004883f, 1.0009766f, 1.3333f, 1.9999f}) {
      src.push_back(std::ldexp(m, e));
      src.push_back(-std::ldexp(m, e));
    }
  for (float v : test::uniform_vec(1001, 3, -70000.0f, 70000.0f)) src.push_back(v);
  src.push_back(std::numeric_limits<float>::infinity());
  src.push_back(0.0f);
  src.push_back(-0.0f);
  const int64_t n = static_cast<int64_t>(src.size());
  std::vector<uint16_t> h(src.size());
  fp32_to_fp16(src.data(), h.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h[i], float_to_fp16(src[i])) << "value " << src[i];
  std::vector<float> back(src.size());
  fp16_to_fp32(h.data(), back.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits(back[i]), bits(fp16_to_float(h[i]))) << "half " << h[i];
  RecordProperty("f16c", fp16_uses_f16c() ? "yes" : "no");
}

struct QCase {
  std::string spec;
  int64_t k, n;
  bool asym;
};

class QuantCases : public ::testing::TestWithParam<QCase> {};

TEST_P(QuantCases, QuantiseErrorIsAtMostHalfAScale) {
  const QCase c = GetParam();
  const QuantSpec spec = QuantSpec::parse(c.spec);
  Tensor w({c.n, c.k});  // Megatron layout [out, in]
  fill_uniform(w.mat(), 11, -2.0f, 0.5f);
  Int8Weight q = quantize_weight(w.mat(), WeightLayout::kNK, spec, c.asym);
  q.validate("test");
  EXPECT_EQ(q.k, c.k);
  EXPECT_EQ(q.n, c.n);
  EXPECT_EQ(static_cast<int64_t>(q.scale.size()), spec.scale_rows(c.k) * spec.scale_cols(c.n));
  EXPECT_EQ(q.offset.empty(), !c.asym);
  EXPECT_LT(q.bytes() * 3, static_cast<int64_t>(w.numel() * 4));  // about 4× smaller
  const Tensor d = dequantize(q);
  for (int64_t p = 0; p < c.k; ++p)
    for (int64_t j = 0; j < c.n; ++j) {
      const int64_t sr = spec.granularity == QuantGranularity::kPerGroup ? p / spec.group : 0;
      const int64_t sc = spec.granularity == QuantGranularity::kPerTensor ? 0 : j;
      const float s = q.scale[static_cast<size_t>(sr * spec.scale_cols(c.n) + sc)];
      ASSERT_LE(std::fabs(d.mat().row(p)[j] - w.mat().row(j)[p]), 0.5f * s * 1.001f) << p << "," << j;
    }
}

TEST_P(QuantCases, PanelGemmMatchesFp64OnTheDequantisedWeight) {
  const QCase c = GetParam();
  const QuantSpec spec = QuantSpec::parse(c.spec);
  Tensor w({c.k, c.n});
  fill_uniform(w.mat(), 5);
  const Int8Weight q = quantize_weight(w.mat(), WeightLayout::kKN, spec, c.asym);
  const Tensor wd = dequantize(q);
  const int64_t m = 37;
  Tensor x({m, c.k});
  fill_uniform(x.mat(), 6);
  // fp16 activations: the reference uses the fp16-rounded values, since that is what the GEMM sees.
  std::vector<uint16_t> xh(static_cast<size_t>(m * c.k));
  fp32_to_fp16(x.data(), xh.data(), m * c.k);
  Tensor xr({m, c.k});
  fp16_to_fp32(xh.data(), xr.data(), m * c.k);
  for (bool f16 : {false, true}) {
    const Tensor& xs = f16 ? xr : x;
    const auto ref = ref_matmul_kn(xs.data(), m, c.k, wd.data(), c.n);
    const ActivationView xa = f16 ? ActivationView::f16(xh.data(), m, c.k, c.k) : ActivationView::f32(x.mat());
    for (W8GemmOptions o : {W8GemmOptions{}, W8GemmOptions{.panel_rows = 1}, W8GemmOptions{.panel_rows = 7},
                            W8GemmOptions{.panel_rows = 33, .panel_cols = 5}, W8GemmOptions{.dequantize_all = true}}) {
      Tensor y({m, c.n});
      matmul_w8(xa, q, y.mat(), false, o);
      EXPECT_LE(rel_err(y.data(), ref), 1e-5)
          << c.spec << " fp16=" << f16 << " panel=" << o.panel_rows << "x" << o.panel_cols << " all=" << o.dequantize_all;
    }
    // accumulate adds to what y held
    Tensor y({m, c.n});
    y.fill(1.0f);
    matmul_w8(xa, q, y.mat(), true);
    auto ref1 = ref;
    for (auto& v : ref1) v += 1.0;
    EXPECT_LE(rel_err(y.data(), ref1), 1e-5) << c.spec << " accumulate";
  }
}

INSTANTIATE_TEST_SUITE_P(Granularities, QuantCases,
                         ::testing::Values(QCase{"per-tensor", 96, 40, false}, QCase{"per-tensor", 96, 40, true},
                                           QCase{"per-channel", 300, 17, false}, QCase{"per-channel", 300, 17, true},
                                           QCase{"per-group:32", 128, 24, false},
                                           QCase{"per-group:64", 100, 33, true},    // k not a multiple of g
                                           QCase{"per-group:96", 1000, 8, false}),  // last group short (40 rows)
                         [](const auto& info) {
                           std::string s = info.param.spec + (info.param.asym ? "_asym" : "_sym");
                           for (char& ch : s)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

TEST(QuantErrors, GroupSizeMustBeAMultipleOf32BelowK) {
  EXPECT_NE(std::string(expect_error([] { QuantSpec::parse("per-group:48"); }).what()).find("multiple of 32"),
            std::string::npos);
  EXPECT_NE(std::string(expect_error([] { QuantSpec::parse("per-group:0"); }).what()).find("multiple of 32"),
            std::string::npos);
  EXPECT_NE(std::string(expect_error([] { QuantSpec::parse("per-group:x"); }).what()).find("integer"),
            std::string::npos);
  EXPECT_NE(std::string(expect_error([] { QuantSpec::parse("per-row"); }).what()).find("per-tensor"),
            std::string::npos);
  Tensor w({64, 8});
  const Error e = expect_error([&] { quantize_weight(w.mat(), WeightLayout::kKN, QuantSpec::parse("per-group:64"), false); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("less than k=64"), std::string::npos) << e.what();
}

TEST(QuantErrors, ScaleAndOffsetShapesAreChecked) {
  Tensor w({128, 8});
  fill_uniform(w.mat(), 1);
  Int8Weight q = quantize_weight(w.mat(), WeightLayout::kKN, QuantSpec::parse("per-group:32"), true);
  Int8Weight bad = q;
  bad.scale.pop_back();
  std::string msg = expect_error([&] { bad.validate("layer.w"); }).what();
  EXPECT_NE(msg.find("must be [4, 8]"), std::string::npos) << msg;
  bad = q;
  bad.offset.resize(3);
  msg = expect_error([&] { bad.validate("layer.w"); }).what();
  EXPECT_NE(msg.find("offset has 3 values"), std::string::npos) << msg;
  bad = q;
  bad.q.resize(10);
  msg = expect_error([&] { bad.validate("layer.w"); }).what();
  EXPECT_NE(msg.find("int8 weight holds 10 values"), std::string::npos) << msg;
}

// bf16 activations (--bf16's) are widened exactly, so the GEMM gives the bits of the fp32 path on the same values,
// with a padded leading dimension too.
TEST(QuantGemm, Bf16ActivationsGiveTheBitsOfTheirFp32Values) {
  const int64_t m = 19, k = 70, n = 33, ld = 75;
  Tensor w({k, n});
  fill_uniform(w.mat(), 7);
  const Int8Weight q = quantize_weight(w.mat(), WeightLayout::kKN, QuantSpec::parse("per-group:32"), true);
  Tensor x({m, ld});
  fill_uniform(x.mat(), 8);
  round_to_bf16(x.data(), m * ld);
  std::vector<BFloat16> xb(static_cast<size_t>(m * ld));
  fp32_to_bf16(x.data(), xb.data(), m * ld);
  Tensor y32({m, n}), y16({m, n});
  matmul_w8(ActivationView::f32(x.mat().slice_cols(0, k)), q, y32.mat());
  matmul_w8(ActivationView::bf16(xb.data(), m, k, ld), q, y16.mat());
  EXPECT_EQ(std::memcmp(y32.data(), y16.data(), static_cast<size_t>(m * n) * 4), 0);
}

TEST(QuantErrors, ActivationDtypeAndShapeAreChecked) {
  Tensor w({64, 8});
  fill_uniform(w.mat(), 1);
  const Int8Weight q = quantize_weight(w.mat(), WeightLayout::kKN, QuantSpec::parse("per-channel"), false);
  std::vector<uint16_t> x(4 * 64);
  Tensor y({4, 8});
  ActivationView i8{x.data(), DType::kInt8, 4, 64, 64};
  std::string msg = expect_error([&] { matmul_w8(i8, q, y.mat()); }).what();
  EXPECT_NE(msg.find("int8"), std::string::npos) << msg;
  Int8Weight bad = q;
  bad.scale.resize(1);
  Tensor x64({4, 64});
  msg = expect_error([&] { matmul_w8(ActivationView::f32(x64.mat()), bad, y.mat()); }).what();
  EXPECT_NE(msg.find("scale has 1 values"), std::string::npos) << msg;
  Tensor xf({4, 32});
  msg = expect_error([&] { matmul_w8(ActivationView::f32(xf.mat()), q, y.mat()); }).what();
  EXPECT_NE(msg.find("k=64"), std::string::npos) << msg;
}

}  // namespace
}  // namespace coc
