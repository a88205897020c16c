// The int8-weight GEMM y = x · dequantize(w) (quant.h). The weight is dequantised one [256-row × ≤1 MiB] block
// at a time into a per-thread fp32 scratch and each block goes through the fp32 gemm(), accumulating into y's column
// block: the full fp32 weight never exists (that is the point of w8a16: 4× less weight memory), and a 256-row
// k-panel matches OpenBLAS's own k-blocking, so the extra passes over y cost little (measured at 0.9–1.1× of
// sgemm, docs/performance.md). W8GemmOptions::dequantize_all is the simple baseline that materialises the whole
// fp32 weight per call (1.5–12× slower there).
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "coc/core/error.h"
#include "coc/kernels/quant.h"

namespace coc {

ActivationView ActivationView::slice_rows(int64_t begin, int64_t count) const {
  const size_t elem = static_cast<size_t>(dtype_size(dtype));
  return {static_cast<const char*>(data) + static_cast<size_t>(begin * ld) * elem, dtype, count, cols, ld};
}

std::string check_activation(const ActivationView& x, int64_t k) {
  if (x.dtype != DType::kF32 && x.dtype != DType::kF16 && x.dtype != DType::kBF16)
    return fmt::format("activation dtype {} is not supported: w8a16 takes fp32, fp16 or bf16 activations; "
                       "dequantise or convert it first",
                       to_string(x.dtype));
  if (x.rows < 0 || x.cols < 0 || x.ld < x.cols || (x.rows > 0 && !x.data))
    return fmt::format("activation view [{}, {}] ld {} is malformed (need rows, cols >= 0, ld >= cols, data set)",
                       x.rows, x.cols, x.ld);
  if (x.cols != k)
    return fmt::format("activation is [{}, {}] but the int8 weight has k={} in-features; pass x as [m, {}]", x.rows,
                       x.cols, k, k);
  return {};
}

void activation_to_f32(const ActivationView& x, float* dst) {
  const auto* base = static_cast<const char*>(x.data);
  const size_t row_bytes = static_cast<size_t>(x.ld * dtype_size(x.dtype));
  for (int64_t i = 0; i < x.rows; ++i) {
    const void* row = base + static_cast<size_t>(i) * row_bytes;
    if (x.dtype == DType::kF32)
      std::copy_n(static_cast<const float*>(row), x.cols, dst + i * x.cols);
    else
      half_to_fp32(x.dtype, row, dst + i * x.cols, x.cols);
  }
}

namespace {
/// x as fp32: a view of it when it already is, else converted into `buf`.
ConstMatrixView as_f32(const ActivationView& x, std::vector<float, AlignedAllocator<float>>& buf) {
  if (x.dtype == DType::kF32) return {static_cast<const float*>(x.data), x.rows, x.cols, x.ld};
  buf.resize(static_cast<size_t>(x.rows * x.cols));
  activation_to_f32(x, buf.data());
  return {buf.data(), x.rows, x.cols, x.cols};
}
}  // namespace

void matmul_w8(ActivationView x, const Int8Weight& w, MatrixView y, bool accumulate, const W8GemmOptions& opts) {
  w.validate("matmul_w8");  // size checks only (O(1)): a malformed weight must not read out of bounds
  if (std::string e = check_activation(x, w.k); !e.empty()) throw_invalid("matmul_w8: {}", e);
  if (y.rows != x.rows || y.cols != w.n)
    throw_invalid("matmul_w8: y is [{}, {}] but x [{}, {}] · w [{}, {}] is [{}, {}]", y.rows, y.cols, x.rows, x.cols,
                  w.k, w.n, x.rows, w.n);
  if (opts.panel_rows < 0 || opts.panel_cols < 0)
    throw_invalid("matmul_w8: panel_rows and panel_cols must be >= 0 (0 = automatic), got {} and {}", opts.panel_rows,
                  opts.panel_cols);
  if (x.rows == 0 || w.n == 0) return;
  std::vector<float, AlignedAllocator<float>> xbuf;
  const ConstMatrixView xf = as_f32(x, xbuf);
  const int64_t k = w.k, n = w.n;
  constexpr int64_t kPanelBytes = 1 << 20;  // Zen 3's L2: 512 KiB; 1 MiB measured as fast (docs/performance.md)
  const int64_t pr = opts.dequantize_all ? k : std::min(k, opts.panel_rows > 0 ? opts.panel_rows : int64_t{256});
  const int64_t pc = opts.dequantize_all ? n
                     : opts.panel_cols > 0 ? std::min(n, opts.panel_cols)
                                           : std::min(n, std::max<int64_t>(64, kPanelBytes / (4 * pr)));
  // One scratch per thread, reused across calls: a fresh buffer per call costs page faults on first touch.
  thread_local std::vector<float, AlignedAllocator<float>> scratch;
  if (static_cast<int64_t>(scratch.size()) < pr * pc) scratch.resize(static_cast<size_t>(pr * pc));
  for (int64_t j0 = 0; j0 < n; j0 += pc) {
    const int64_t cols = std::min(pc, n - j0);
    MatrixView yb = y.slice_cols(j0, cols);
    for (int64_t p0 = 0; p0 < k; p0 += pr) {
      const int64_t rows = std::min(pr, k - p0);
      MatrixView wp{scratch.data(), rows, cols, cols};
      dequantize_block(w, p0, j0, wp);
      gemm(xf.slice_cols(p0, rows), false, wp, false, yb, 1.0f, (accumulate || p0 > 0) ? 1.0f : 0.0f);
    }
  }
  if (opts.dequantize_all) {
    // The baseline must not keep a weight-sized buffer alive after the call.
    scratch.clear();
    scratch.shrink_to_fit();
  }
}

}  // namespace coc
