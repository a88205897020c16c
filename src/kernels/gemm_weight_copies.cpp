// GemmWeightCopies (coc/kernels/gemm.h): one process-wide table of weight buffers, each with a bf16 copy made on
// its first read; and GemmOperandCopy, the same for one activation, per thread. A table rather than a bf16 twin
// inside each parameter: the weights reach gemm() as plain views through the CoC ops, the fused kernels and the
// deterministic tiles, and a lookup by address serves them all without a bf16 overload on each.
#include "gemm_weight_copies.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/runtime/tracer.h"

namespace coc {

namespace {

struct WeightCopy {
  const float* begin;
  const float* end;
  std::vector<BFloat16> bf16;  ///< kept from iteration to iteration: allocating it anew would fault its pages in
  bool rounded = false;        ///< bf16 holds this iteration's values
};

/// Sorted by begin, non-overlapping. The mutex guards the lazy rounding; `live` lets the fp32 paths skip it.
struct Table {
  std::mutex mu;
  std::atomic<bool> live{false};
  std::vector<WeightCopy> copies;
};

Table& table() {
  static Table t;
  return t;
}

}  // namespace

GemmWeightCopies::GemmWeightCopies(const std::vector<std::span<const float>>& weights) {
  Table& t = table();
  std::lock_guard lock(t.mu);
  COC_ASSERT(!t.live.load(), "GemmWeightCopies: another instance is alive");
  if (gemm_compute_type() != DType::kBF16) return;
  // The same weights as last iteration keep their buffers (sorted by address, as the table).
  std::vector<WeightCopy> old = std::move(t.copies);
  t.copies.clear();
  for (const auto& w : weights)
    if (!w.empty()) t.copies.push_back({w.data(), w.data() + w.size(), {}});
  std::sort(t.copies.begin(), t.copies.end(), [](const auto& x, const auto& y) { return x.begin < y.begin; });
  for (size_t i = 0, j = 0; i < t.copies.size() && j < old.size();) {
    if (old[j].begin < t.copies[i].begin) {
      ++j;
    } else if (t.copies[i].begin < old[j].begin) {
      ++i;
    } else {
      if (old[j].end == t.copies[i].end) t.copies[i].bf16 = std::move(old[j].bf16);
      ++i, ++j;
    }
  }
  for (size_t i = 1; i < t.copies.size(); ++i)
    COC_ASSERT(t.copies[i - 1].end <= t.copies[i].begin, "GemmWeightCopies: weight buffers overlap");
  t.live.store(true);
}

GemmWeightCopies::~GemmWeightCopies() {
  Table& t = table();
  std::lock_guard lock(t.mu);
  t.live.store(false);
  for (WeightCopy& c : t.copies) c.rounded = false;  // the optimizer writes the weights next
}

namespace detail {

std::optional<MatrixViewT<const BFloat16>> weight_copy_bf16(ConstMatrixView x) {
  Table& t = table();
  if (!t.live.load(std::memory_order_acquire) || x.rows == 0 || x.cols == 0) return std::nullopt;
  const float* last = x.data + (x.rows - 1) * x.ld + x.cols;  // one past the view's last element
  std::lock_guard lock(t.mu);
  auto it = std::upper_bound(t.copies.begin(), t.copies.end(), x.data,
                             [](const float* p, const WeightCopy& c) { return p < c.begin; });
  if (it == t.copies.begin()) return std::nullopt;
  WeightCopy& c = *--it;
  if (x.data >= c.end || last > c.end) return std::nullopt;
  if (!c.rounded) {
    c.bf16.resize(static_cast<size_t>(c.end - c.begin));
    COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "fp32_to_bf16", {"elements", c.end - c.begin});
    fp32_to_bf16(c.begin, c.bf16.data(), c.end - c.begin);
    c.rounded = true;
  }
  return MatrixViewT<const BFloat16>{c.bf16.data() + (x.data - c.begin), x.rows, x.cols, x.ld};
}

}  // namespace detail

// ---- GemmOperandCopy ---------------------------------------------------------------------------------------------

namespace {

/// One live GemmOperandCopy: its activation (rows × cols, leading dimension ld, from begin), where its copy starts
/// in the thread's buffer (the same leading dimension), and which rows the copy holds yet.
struct OperandCopy {
  const float* begin;
  int64_t rows, cols, ld;
  size_t offset;
  std::vector<uint8_t> rounded;  ///< per row
  size_t span() const { return static_cast<size_t>((rows - 1) * ld + cols); }
  bool holds(const float* p, int64_t r, int64_t c, int64_t view_ld) const {
    if (p < begin || p >= begin + span() || (r > 1 && view_ld != ld)) return false;
    const int64_t at = p - begin;
    return at / ld + r <= rows && at % ld + c <= cols;
  }
};

/// Per thread: the live copies, innermost last, over one buffer kept between them (grown, never shrunk).
struct OperandCopies {
  std::vector<OperandCopy> live;
  std::vector<BFloat16> buf;
};
thread_local OperandCopies t_operands;

}  // namespace

GemmOperandCopy::GemmOperandCopy(ConstMatrixView x) {
  if (gemm_compute_type() != DType::kBF16 || x.rows == 0 || x.cols == 0) return;
  OperandCopies& t = t_operands;
  for (const OperandCopy& c : t.live)
    if (c.holds(x.data, x.rows, x.cols, x.ld)) return;  // the enclosing copy serves x
  size_t offset = 0;
  if (!t.live.empty()) offset = t.live.back().offset + t.live.back().span();
  OperandCopy c{x.data, x.rows, x.cols, x.ld, offset, std::vector<uint8_t>(static_cast<size_t>(x.rows), 0)};
  if (t.buf.size() < offset + c.span()) t.buf.resize(offset + c.span());  // no view into the buffer is in use
  index_ = t.live.size();
  t.live.push_back(std::move(c));
  active_ = true;
}

GemmOperandCopy::~GemmOperandCopy() {
  if (active_) t_operands.live.pop_back();
}

MatrixViewT<BFloat16> GemmOperandCopy::fill_rows(int64_t first, int64_t count) {
  if (!active_) return {};
  OperandCopies& t = t_operands;
  OperandCopy& c = t.live[index_];  // copies made since, inside this one's scope, lie above it
  COC_ASSERT(first >= 0 && count >= 0 && first + count <= c.rows, "GemmOperandCopy::fill_rows: rows [{}, {}) of {}",
             first, first + count, c.rows);
  std::fill_n(c.rounded.begin() + first, count, uint8_t{1});
  return {t.buf.data() + c.offset + first * c.ld, count, c.cols, c.ld};
}

namespace detail {

std::optional<MatrixViewT<const BFloat16>> operand_copy_bf16(ConstMatrixView x) {
  OperandCopies& t = t_operands;
  if (t.live.empty() || x.rows == 0 || x.cols == 0) return std::nullopt;
  for (auto it = t.live.rbegin(); it != t.live.rend(); ++it) {
    if (!it->holds(x.data, x.rows, x.cols, x.ld)) continue;
    BFloat16* copy = t.buf.data() + it->offset;
    const int64_t first = (x.data - it->begin) / it->ld;
    for (int64_t i = first; i < first + x.rows;) {  // round the runs of rows not read or filled yet
      if (it->rounded[static_cast<size_t>(i)]) {
        ++i;
        continue;
      }
      int64_t end = i + 1;
      while (end < first + x.rows && !it->rounded[static_cast<size_t>(end)]) ++end;
      COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "fp32_to_bf16", {"elements", (end - i) * it->cols});
      fp32_to_bf16_rows(it->begin + i * it->ld, it->ld, copy + i * it->ld, it->ld, end - i, it->cols);
      std::fill(it->rounded.begin() + i, it->rounded.begin() + end, uint8_t{1});
      i = end;
    }
    return MatrixViewT<const BFloat16>{copy + (x.data - it->begin), x.rows, x.cols, it->ld};
  }
  return std::nullopt;
}

}  // namespace detail
}  // namespace coc
