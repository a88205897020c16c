#include "coc/core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <new>

#include "coc/core/error.h"

namespace coc {

template <typename T>
T* AlignedAllocator<T>::allocate(std::size_t n) {
  if (n == 0) return nullptr;
  std::size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  return static_cast<T*>(p);
}
template <typename T>
void AlignedAllocator<T>::deallocate(T* p, std::size_t) noexcept {
  std::free(p);
}
template struct AlignedAllocator<float>;
template struct AlignedAllocator<BFloat16>;

void Bf16Matrix::resize(int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) throw_invalid("bf16 matrix shape [{}, {}] has a negative dimension", rows, cols);
  if (rows == rows_ && cols == cols_) return;
  data_.assign(static_cast<size_t>(rows * cols), BFloat16{});
  rows_ = rows;
  cols_ = cols;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Tensor::Tensor(std::vector<int64_t> shape) { resize(std::move(shape)); }

void Tensor::resize(std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw_invalid("tensor shape {} has a negative dimension", shape_to_string(shape));
    n *= d;
  }
  if (shape == shape_ && static_cast<int64_t>(data_.size()) == n) return;
  shape_ = std::move(shape);
  data_.assign(static_cast<size_t>(n), 0.0f);
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  if (i < 0) i += n;
  COC_ASSERT(i >= 0 && i < n, "dim {} of tensor {}", i, shape_str());
  return shape_[static_cast<size_t>(i)];
}
int64_t Tensor::rows() const {
  int64_t r = 1;
  for (size_t i = 0; i + 1 < shape_.size(); ++i) r *= shape_[i];
  return r;
}
int64_t Tensor::cols() const { return shape_.empty() ? 0 : shape_.back(); }
void Tensor::zero() { std::fill(data_.begin(), data_.end(), 0.0f); }
void Tensor::fill(float v) { std::fill(data_.begin(), data_.end(), v); }
std::string Tensor::shape_str() const { return shape_to_string(shape_); }

}  // namespace coc
