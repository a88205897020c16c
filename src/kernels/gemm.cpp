#include "coc/kernels/gemm.h"

#include <cblas.h>
#include <cpuid.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <type_traits>
#include <vector>

#include "coc/core/bf16.h"
#include "coc/core/env_registry.h"
#include "coc/core/error.h"
#include "coc/runtime/tracer.h"
#include "gemm_onednn.h"
#include "gemm_weight_copies.h"

namespace coc {

const char* to_string(WeightLayout l) { return l == WeightLayout::kNK ? "[n,k]" : "[k,n]"; }

// ---- back end choice ---------------------------------------------------------------------------------------------

const char* to_string(GemmBackend b) {
  switch (b) {
    case GemmBackend::kAuto: return "auto";
    case GemmBackend::kOneDnn: return "onednn";
    case GemmBackend::kOpenBlas: return "openblas";
  }
  return "?";
}

GemmBackend parse_gemm_backend(const std::string& s, const std::string& flag) {
  if (s == "auto") return GemmBackend::kAuto;
  if (s == "onednn" || s == "dnnl") return GemmBackend::kOneDnn;
  if (s == "openblas") return GemmBackend::kOpenBlas;
  throw_invalid("{} '{}' is not a GEMM back end; use auto (oneDNN on AVX-512 CPUs, OpenBLAS otherwise), onednn or "
                "openblas",
                flag, s);
}

namespace {
/// -1 until the first GEMM or set_gemm_backend; then a resolved GemmBackend.
std::atomic<int> g_backend{-1};

GemmBackend resolve(GemmBackend b) {
  if (b != GemmBackend::kAuto) return b;
  // oneDNN's ISA values are nested bit masks, ordered except avx2_vnni (Alder Lake's AVX2), which sits above them.
  const auto isa = dnnl::get_effective_cpu_isa();
  const bool avx512 = isa != dnnl::cpu_isa::avx2_vnni &&
                      static_cast<int>(isa) >= static_cast<int>(dnnl::cpu_isa::avx512_core);
  return avx512 ? GemmBackend::kOneDnn : GemmBackend::kOpenBlas;
}
}  // namespace

void set_gemm_backend(GemmBackend b) { g_backend.store(static_cast<int>(resolve(b))); }

GemmBackend gemm_backend() {
  int b = g_backend.load(std::memory_order_relaxed);
  if (b < 0) {
    const GemmBackend chosen =
        resolve(parse_gemm_backend(env::get(env::Var::kGemmBackend), env::spec(env::Var::kGemmBackend).name.data()));
    int expected = -1;
    g_backend.compare_exchange_strong(expected, static_cast<int>(chosen));
    b = g_backend.load();
  }
  return static_cast<GemmBackend>(b);
}

OneDnnInfo onednn_info() {
  OneDnnInfo info;
  const dnnl_version_t* v = dnnl_version();
  info.version = fmt::format("{}.{}.{}", v->major, v->minor, v->patch);
  const auto isa = dnnl::get_effective_cpu_isa();
  switch (isa) {
    case dnnl::cpu_isa::sse41: info.isa = "sse41"; break;
    case dnnl::cpu_isa::avx: info.isa = "avx"; break;
    case dnnl::cpu_isa::avx2: info.isa = "avx2"; break;
    case dnnl::cpu_isa::avx2_vnni: info.isa = "avx2_vnni"; break;
    case dnnl::cpu_isa::avx512_core: info.isa = "avx512_core"; break;
    case dnnl::cpu_isa::avx512_core_vnni: info.isa = "avx512_core_vnni"; break;
    case dnnl::cpu_isa::avx512_core_bf16: info.isa = "avx512_core_bf16"; break;
    case dnnl::cpu_isa::avx512_core_amx: info.isa = "avx512_core_amx"; break;
    default: info.isa = fmt::format("isa#{}", static_cast<int>(isa)); break;
  }
  info.bf16_native = isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
  info.f32_kernel = detail::onednn_kernel_name(DType::kF32);
  info.bf16_kernel = detail::onednn_kernel_name(DType::kBF16);
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool amx_bf16 = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 && (edx & (1u << 22)) != 0;
  info.amx_unused = amx_bf16 && info.bf16_native && info.bf16_kernel.find("amx") == std::string::npos;
  return info;
}

int64_t onednn_primitives_created() { return detail::onednn_primitives_created(); }

// ---- GEMMs -------------------------------------------------------------------------------------------------------

namespace {

/// m, k, n of c = op(a)·op(b), checked; shared by every element type.
template <typename A, typename C>
std::array<int64_t, 3> gemm_dims(MatrixViewT<A> a, bool trans_a, MatrixViewT<A> b, bool trans_b, MatrixViewT<C> c) {
  const int64_t m = trans_a ? a.cols : a.rows;
  const int64_t k = trans_a ? a.rows : a.cols;
  const int64_t kb = trans_b ? b.cols : b.rows;
  const int64_t n = trans_b ? b.rows : b.cols;
  COC_ASSERT(k == kb && c.rows == m && c.cols == n, "gemm shapes: op(a) [{}, {}], op(b) [{}, {}], c [{}, {}]", m, k,
             kb, n, c.rows, c.cols);
  return {m, k, n};
}

/// Leading dimension as the libraries want it: a 1-row view may carry ld = 0, which both reject.
int64_t ld_of(int64_t ld, int64_t cols) { return std::max<int64_t>({ld, cols, 1}); }

/// c = beta · c for k = 0 (no product to add).
template <typename C>
void scale_only(MatrixViewT<C> c, float beta) {
  for (int64_t i = 0; i < c.rows; ++i)
    for (int64_t j = 0; j < c.cols; ++j) {
      if constexpr (std::is_same_v<C, float>)
        c.row(i)[j] = beta == 0.0f ? 0.0f : beta * c.row(i)[j];
      else
        c.row(i)[j] = float_to_bf16(beta == 0.0f ? 0.0f : beta * bf16_to_float(c.row(i)[j]));
    }
}

template <typename A, typename C>
void gemm_any(MatrixViewT<const A> a, bool trans_a, MatrixViewT<const A> b, bool trans_b, MatrixViewT<C> c,
              float alpha, float beta, bool onednn) {
  const auto [m, k, n] = gemm_dims(a, trans_a, b, trans_b, c);
  if (m == 0 || n == 0) return;
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "gemm", {"m", m}, {"k", k}, {"n", n},
                  {"flop", 2 * m * n * k}, {"dtype_bits", 8 * dtype_size(dtype_of<A>())});
  if (k == 0) return scale_only(c, beta);
  if (onednn) {
    detail::onednn_gemm({a.data, dtype_of<A>(), ld_of(a.ld, a.cols), trans_a},
                        {b.data, dtype_of<A>(), ld_of(b.ld, b.cols), trans_b}, c.data, dtype_of<C>(),
                        ld_of(c.ld, c.cols), m, n, k, alpha, beta);
    return;
  }
  if constexpr (std::is_same_v<A, float> && std::is_same_v<C, float>) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a.data,
                static_cast<blasint>(ld_of(a.ld, a.cols)), b.data, static_cast<blasint>(ld_of(b.ld, b.cols)), beta,
                c.data, static_cast<blasint>(ld_of(c.ld, c.cols)));
  }
}

}  // namespace

// ---- compute type ------------------------------------------------------------------------------------------------

namespace {
std::atomic<int> g_compute{static_cast<int>(DType::kF32)};
thread_local int t_compute = -1;  ///< a GemmComputeScope's type, -1 when none is alive

/// A stored matrix [rows, cols] (leading dimension ld) rounded into dense bf16 scratch `buf`.
ConstBf16View to_bf16(ConstMatrixView x, std::vector<BFloat16>& buf) {
  // Grown, never shrunk: resizing up to a size the vector had zero-fills again (perf showed memset at 4%).
  if (buf.size() < static_cast<size_t>(x.rows * x.cols)) buf.resize(static_cast<size_t>(x.rows * x.cols));
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "fp32_to_bf16", {"elements", x.rows * x.cols});
  fp32_to_bf16_rows(x.data, x.ld, buf.data(), x.cols, x.rows, x.cols);
  return {buf.data(), x.rows, x.cols, x.cols};
}

/// x as bf16: its weight copy (GemmWeightCopies) when it is a weight's, its GemmOperandCopy when it lies in one,
/// else rounded into `buf`.
ConstBf16View as_bf16(ConstMatrixView x, std::vector<BFloat16>& buf) {
  if (const auto w = detail::weight_copy_bf16(x)) return *w;
  if (const auto o = detail::operand_copy_bf16(x)) return *o;
  return to_bf16(x, buf);
}

/// A stored matrix rounded to fp16 values, dense, in fp32 scratch `buf`: the operand of an fp16 GEMM run on fp32
/// kernels (a product of two fp16 values has 22 significant bits and is exact in fp32).
ConstMatrixView to_fp16_values(ConstMatrixView x, std::vector<float>& buf) {
  if (buf.size() < static_cast<size_t>(x.rows * x.cols)) buf.resize(static_cast<size_t>(x.rows * x.cols));
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "round_fp16", {"elements", x.rows * x.cols});
  for (int64_t i = 0; i < x.rows; ++i) {
    std::copy(x.row(i), x.row(i) + x.cols, buf.data() + i * x.cols);
    round_to_half(DType::kF16, buf.data() + i * x.cols, x.cols);
  }
  return {buf.data(), x.rows, x.cols, x.cols};
}
}  // namespace

void set_gemm_compute_type(DType t) {
  if (t != DType::kF32 && t != DType::kBF16 && t != DType::kF16)
    throw_invalid("GEMM compute type {}: coc's fp32 GEMMs compute in fp32, bf16 or fp16", to_string(t));
  g_compute.store(static_cast<int>(t));
}

DType gemm_compute_type() {
  return static_cast<DType>(t_compute >= 0 ? t_compute : g_compute.load(std::memory_order_relaxed));
}

GemmComputeScope::GemmComputeScope(DType t) : saved_(t_compute) { t_compute = static_cast<int>(t); }
GemmComputeScope::~GemmComputeScope() { t_compute = saved_; }

void store_as_compute_type(MatrixView y) {
  const DType t = gemm_compute_type();
  if (t == DType::kF32) return;
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, t == DType::kBF16 ? "round_bf16" : "round_fp16", {"elements", y.rows * y.cols});
  if (y.ld == y.cols || y.rows <= 1) return round_to_half(t, y.data, y.rows * y.cols);
  for (int64_t i = 0; i < y.rows; ++i) round_to_half(t, y.row(i), y.cols);
}

void gemm(ConstMatrixView a, bool trans_a, ConstMatrixView b, bool trans_b, MatrixView c, float alpha, float beta) {
  if (gemm_compute_type() == DType::kBF16) {
    gemm_dims(a, trans_a, b, trans_b, c);  // before converting: a shape error names the fp32 operands
    thread_local std::vector<BFloat16> sa, sb;
    return gemm_any(as_bf16(a, sa), trans_a, as_bf16(b, sb), trans_b, c, alpha, beta, true);
  }
  if (gemm_compute_type() == DType::kF16) {  // no target CPU multiplies fp16: fp16 values on fp32 kernels
    gemm_dims(a, trans_a, b, trans_b, c);
    thread_local std::vector<float> fa, fb;
    return gemm_any(to_fp16_values(a, fa), trans_a, to_fp16_values(b, fb), trans_b, c, alpha, beta,
                    gemm_backend() == GemmBackend::kOneDnn);
  }
  gemm_any(a, trans_a, b, trans_b, c, alpha, beta, gemm_backend() == GemmBackend::kOneDnn);
}

void gemm(ConstBf16View a, bool trans_a, ConstBf16View b, bool trans_b, MatrixView c, float alpha, float beta) {
  gemm_any(a, trans_a, b, trans_b, c, alpha, beta, true);
}

void gemm(ConstBf16View a, bool trans_a, ConstBf16View b, bool trans_b, Bf16View c, float alpha, float beta) {
  gemm_any(a, trans_a, b, trans_b, c, alpha, beta, true);
}

void matmul(ConstMatrixView x, ConstMatrixView w, WeightLayout layout, MatrixView y, bool accumulate) {
  gemm(x, false, w, layout == WeightLayout::kNK, y, 1.0f, accumulate ? 1.0f : 0.0f);
}
void matmul(ConstBf16View x, ConstBf16View w, WeightLayout layout, MatrixView y, bool accumulate) {
  gemm(x, false, w, layout == WeightLayout::kNK, y, 1.0f, accumulate ? 1.0f : 0.0f);
}
void matmul(ConstBf16View x, ConstBf16View w, WeightLayout layout, Bf16View y, bool accumulate) {
  gemm(x, false, w, layout == WeightLayout::kNK, y, 1.0f, accumulate ? 1.0f : 0.0f);
}

void matmul(ConstBf16View x, ConstMatrixView w, WeightLayout layout, MatrixView y, bool accumulate) {
  thread_local std::vector<BFloat16> sw;
  gemm_any(x, false, as_bf16(w, sw), layout == WeightLayout::kNK, y, 1.0f, accumulate ? 1.0f : 0.0f, true);
}

void matmul(ConstMatrixView x, ConstMatrixView w, WeightLayout layout, Bf16View y) {
  const bool trans_w = layout == WeightLayout::kNK;
  if (gemm_compute_type() == DType::kBF16) {
    gemm_dims(x, false, w, trans_w, y);
    thread_local std::vector<BFloat16> sx, sw;
    return gemm_any(as_bf16(x, sx), false, as_bf16(w, sw), trans_w, y, 1.0f, 0.0f, true);
  }
  thread_local std::vector<float> wide;
  if (wide.size() < static_cast<size_t>(y.rows * y.cols)) wide.resize(static_cast<size_t>(y.rows * y.cols));
  const MatrixView f{wide.data(), y.rows, y.cols, y.cols};
  matmul(x, w, layout, f);
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "fp32_to_bf16", {"elements", y.rows * y.cols});
  fp32_to_bf16_rows(f.data, f.ld, y.data, y.ld, y.rows, y.cols);
}

void gemm(ConstMatrixView a, bool trans_a, ConstBf16View b, bool trans_b, MatrixView c, float alpha, float beta) {
  thread_local std::vector<BFloat16> sa;
  gemm_any(as_bf16(a, sa), trans_a, b, trans_b, c, alpha, beta, true);
}

void gemm(ConstBf16View a, bool trans_a, ConstMatrixView b, bool trans_b, MatrixView c, float alpha, float beta) {
  thread_local std::vector<BFloat16> sb;
  gemm_any(a, trans_a, as_bf16(b, sb), trans_b, c, alpha, beta, true);
}

void add_bias(MatrixView y, const float* bias) {
  for (int64_t i = 0; i < y.rows; ++i) {
    float* r = y.row(i);
    for (int64_t j = 0; j < y.cols; ++j) r[j] += bias[j];
  }
}

void accumulate_colsum(ConstMatrixView x, float* out) {
  for (int64_t i = 0; i < x.rows; ++i) {
    const float* r = x.row(i);
    for (int64_t j = 0; j < x.cols; ++j) out[j] += r[j];
  }
}

int set_blas_threads(int n) {
  openblas_set_num_threads(n);
  omp_set_num_threads(n);  // oneDNN's threads (Debian builds it on OpenMP)
  gemm_backend();          // every computing command calls this first: a bad COC_GEMM_BACKEND fails here, not mid-step
  return openblas_get_num_threads();
}
int blas_threads() { return openblas_get_num_threads(); }
std::string blas_config() { return openblas_get_config(); }

}  // namespace coc
