// Dense fp32 tensors: an owning, 64-byte-aligned, row-major buffer plus light 2-D views (of fp32, or of the 16-bit
// element types of coc/core/dtype.h).
//
// Tensors are fp32; 16-bit GEMM operands and messages live in caller-owned buffers seen through views
// (docs/semantics.md §9), and the activations a bf16 run keeps only for bf16 GEMMs in Bf16Matrix. A tensor of
// shape [d0, ..., dn] is
// stored contiguously, last dimension fastest. Most kernels see a tensor as a matrix [rows, cols] where
// rows = d0·…·d(n-1) (tokens, sequence-major: row = s·b + batch) and cols = dn (features).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coc/core/dtype.h"

namespace coc {

/// Allocator returning 64-byte aligned memory, so GEMM panels and MPI buffers start on a cache line.
template <typename T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <typename U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  T* allocate(std::size_t n);
  void deallocate(T* p, std::size_t) noexcept;
  template <typename U>
  bool operator==(const AlignedAllocator<U>&) const { return true; }
};

/// A non-owning view of a row-major matrix [rows, cols] of T with leading dimension `ld` (elements between
/// consecutive rows, ld >= cols). `row(i)` points at row i.
template <typename T>
struct MatrixViewT {
  T* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;
  T* row(int64_t i) const { return data + i * ld; }
  /// Rows [begin, begin+count) of this view.
  MatrixViewT slice_rows(int64_t begin, int64_t count) const { return {data + begin * ld, count, cols, ld}; }
  /// Columns [begin, begin+count) of this view (same ld).
  MatrixViewT slice_cols(int64_t begin, int64_t count) const { return {data + begin, rows, count, ld}; }
  operator MatrixViewT<const T>() const { return {data, rows, cols, ld}; }
};
using MatrixView = MatrixViewT<float>;
using ConstMatrixView = MatrixViewT<const float>;

/// Owning fp32 tensor, zero-initialised on construction. Copyable (deep copy) and movable.
class Tensor {
 public:
  Tensor() = default;
  /// Shape entries must be >= 0; throws a uniform kInvalidArgument error otherwise.
  explicit Tensor(std::vector<int64_t> shape);

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const;          ///< size of dimension i (negative i counts from the end)
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return static_cast<int64_t>(data_.size()); }
  int64_t rows() const;              ///< product of all dimensions but the last (1 for a 1-D tensor)
  int64_t cols() const;              ///< last dimension (0 for an empty shape)
  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  float& operator[](int64_t i) { return data_[static_cast<size_t>(i)]; }
  float operator[](int64_t i) const { return data_[static_cast<size_t>(i)]; }

  MatrixView mat() { return {data(), rows(), cols(), cols()}; }
  ConstMatrixView mat() const { return {data(), rows(), cols(), cols()}; }

  void zero();
  void fill(float v);
  /// Reallocates to `shape` if it differs; contents are then zero. Keeps the buffer otherwise.
  void resize(std::vector<int64_t> shape);
  /// "[4097, 512]"
  std::string shape_str() const;

 private:
  std::vector<int64_t> shape_;
  std::vector<float, AlignedAllocator<float>> data_;
};

/// Owning bf16 matrix [rows, cols], dense and 64-byte aligned, zero bits on (re)allocation. For activations that
/// only bf16 GEMMs read (under --bf16, the gathered rows the linear layers keep for their weight gradients,
/// parallel/linear.h): half the bytes of a Tensor, and no rounding pass when the GEMM reads them. Copyable and
/// movable.
class Bf16Matrix {
 public:
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t numel() const { return rows_ * cols_; }
  int64_t bytes() const { return numel() * static_cast<int64_t>(sizeof(BFloat16)); }
  MatrixViewT<BFloat16> mat() { return {data_.data(), rows_, cols_, cols_}; }
  MatrixViewT<const BFloat16> mat() const { return {data_.data(), rows_, cols_, cols_}; }
  /// Reallocates to [rows, cols] if the shape differs (contents then zero); keeps the buffer otherwise.
  /// Negative sizes: kInvalidArgument.
  void resize(int64_t rows, int64_t cols);

 private:
  int64_t rows_ = 0, cols_ = 0;
  std::vector<BFloat16, AlignedAllocator<BFloat16>> data_;
};

/// "[a, b, c]" for error messages.
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace coc
