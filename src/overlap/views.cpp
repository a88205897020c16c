// Scratch buffers and view checks for the CoC ops (coc_internal.h).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "coc/core/bf16.h"
#include "coc/core/error.h"
#include "coc/runtime/tracer.h"
#include "coc_internal.h"

namespace coc::detail {

namespace {
// Freed scratch buffers, kept for the next call of the same size. Why: the ops run the same shapes every layer and
// step, and a fresh multi-MB buffer costs a page fault and a zeroed page per 4 KB on first touch, inside the GEMM
// that fills it or the socket read that receives into it. Measured on the 1 Gbit/s cluster: readv into fresh
// pages ran at ~0.5 GB/s and doubled the reduce-scatter's GEMM time (σ ≈ 1.2); reused pages make that cost go
// away. Bounded by kCacheBytes; beyond it buffers are simply freed.
constexpr size_t kCacheBytes = size_t{512} << 20;

class ScratchPool {
 public:
  ~ScratchPool() {
    for (auto& [n, list] : free_)
      for (float* p : list) AlignedAllocator<float>().deallocate(p, n);
  }
  float* take(size_t n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(n);
      if (it != free_.end() && !it->second.empty()) {
        float* p = it->second.back();
        it->second.pop_back();
        cached_ -= n * sizeof(float);
        return p;
      }
    }
    return AlignedAllocator<float>().allocate(n);
  }
  void give(float* p, size_t n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + n * sizeof(float) <= kCacheBytes) {
        free_[n].push_back(p);
        cached_ += n * sizeof(float);
        return;
      }
    }
    AlignedAllocator<float>().deallocate(p, n);
  }

 private:
  std::mutex mu_;
  std::map<size_t, std::vector<float*>> free_;
  size_t cached_ = 0;
};

ScratchPool& pool() {
  static ScratchPool p;
  return p;
}
}  // namespace

Scratch make_scratch(int64_t elems) {
  if (elems <= 0) return Scratch();
  const auto n = static_cast<size_t>(elems);
  ScratchPool* pl = &pool();
  return Scratch(pl->take(n), [pl, n](float* q) { pl->give(q, n); });
}

Scratch make_scratch16(int64_t elems) { return make_scratch((elems + 1) / 2); }  // two bf16 per float slot

void to_wire(ConstMatrixView src, BFloat16* dst) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "fp32_to_bf16", {"elements", src.rows * src.cols});
  fp32_to_bf16_rows(src.data, src.ld, dst, src.cols, src.rows, src.cols);
}

void from_wire(const BFloat16* src, MatrixView dst) {
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "bf16_to_fp32", {"elements", dst.rows * dst.cols});
  if (is_contiguous(dst)) {
    bf16_to_fp32(src, dst.data, dst.rows * dst.cols);
    return;
  }
  for (int64_t i = 0; i < dst.rows; ++i) bf16_to_fp32(src + i * dst.cols, dst.row(i), dst.cols);
}

void round_for_wire(const CocOptions& opts, MatrixView x) {
  if (!wire16(opts)) return;
  COC_TRACE_SCOPE(trace::Cat::kCompute, trace::Level::kLevel0, "round_bf16", {"elements", x.rows * x.cols});
  if (is_contiguous(x)) {
    round_to_bf16(x.data, x.rows * x.cols);
    return;
  }
  for (int64_t i = 0; i < x.rows; ++i) round_to_bf16(x.row(i), x.cols);
}

void copy_rows(ConstMatrixView src, MatrixView dst) {
  COC_ASSERT(src.rows == dst.rows && src.cols == dst.cols, "copy_rows [{}, {}] -> [{}, {}]", src.rows, src.cols,
             dst.rows, dst.cols);
  if (src.cols == 0) return;
  if (is_contiguous(src) && is_contiguous(dst)) {
    if (src.rows > 0) std::memmove(dst.data, src.data, static_cast<size_t>(src.rows * src.cols) * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < src.rows; ++i)
    std::memmove(dst.row(i), src.row(i), static_cast<size_t>(src.cols) * sizeof(float));
}

namespace {
// [first, last) byte span of a view; empty views span nothing.
std::pair<uintptr_t, uintptr_t> span_of(ConstMatrixView v) {
  if (v.rows <= 0 || v.cols <= 0 || v.data == nullptr) return {0, 0};
  auto b = reinterpret_cast<uintptr_t>(v.data);
  return {b, b + static_cast<uintptr_t>(((v.rows - 1) * std::max(v.ld, v.cols) + v.cols) * 4)};
}
}  // namespace

bool overlaps(ConstMatrixView x, ConstMatrixView y) {
  auto [xb, xe] = span_of(x);
  auto [yb, ye] = span_of(y);
  if (xb == xe || yb == ye) return false;
  return xb < ye && yb < xe;
}

std::string check_view(ConstMatrixView v, const char* what) {
  if (v.rows < 0 || v.cols < 0)
    return fmt::format("{} has a negative shape [{}, {}]", what, v.rows, v.cols);
  if (v.rows > 1 && v.ld < v.cols)
    return fmt::format("{} [{}, {}] has leading dimension {} < {} columns; pass a row-major view with ld >= cols",
                       what, v.rows, v.cols, v.ld, v.cols);
  if (v.rows > 0 && v.cols > 0 && v.data == nullptr)
    return fmt::format("{} [{}, {}] has no data (null pointer)", what, v.rows, v.cols);
  return {};
}

std::string check_gemm_operands(ConstMatrixView a, ConstMatrixView w, WeightLayout layout, ConstMatrixView out,
                                const CocOptions& opts) {
  std::string e = check_options(opts);
  if (e.empty()) e = check_view(a, "a");
  if (e.empty()) e = check_view(w, "w");
  if (e.empty()) e = check_view(out, "out");
  if (!e.empty()) return e;
  const int64_t wk = weight_k(w, layout);
  if (wk != a.cols)
    return fmt::format("a is [{}, {}] but w is [{}, {}] in layout {}, so its k is {}; a's columns must equal the "
                       "weight's k (this rank's slice of the input features). Check the layout argument (kNK = "
                       "[n,k], Megatron's; kKN = [k,n]) and that a and w were split over the same k range",
                       a.rows, a.cols, w.rows, w.cols, to_string(layout), wk);
  return {};
}

std::string check_out_apart(ConstMatrixView out, ConstMatrixView a, ConstMatrixView w) {
  if (overlaps(out, a) || overlaps(out, w))
    return "out overlaps a or w: the GEMM would overwrite its own inputs; write into a separate buffer";
  return {};
}

}  // namespace coc::detail
