// add_inplace and copy on strided views: exact results, and nothing outside the views is touched.
#include <gtest/gtest.h>

#include "coc/core/error.h"
#include "coc/kernels/transformer_ops.h"
#include "kernel_test_util.h"

namespace coc {
namespace {

TEST(Elementwise, AddInplaceStrided) {
  Tensor ybuf({5, 7}), xbuf({5, 4});
  test::fill_uniform(ybuf.mat(), 41);
  test::fill_uniform(xbuf.mat(), 42);
  const Tensor y0 = ybuf;
  MatrixView y = ybuf.mat().slice_cols(2, 3);
  ConstMatrixView x = xbuf.mat().slice_cols(1, 3);
  add_inplace(y, x);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 7; ++j) {
      const float expect = (j >= 2 && j < 5) ? y0.mat().row(i)[j] + xbuf.mat().row(i)[j - 1] : y0.mat().row(i)[j];
      EXPECT_EQ(ybuf.mat().row(i)[j], expect) << i << ", " << j;
    }
}

// Dense views take one run over every element (the vectorised loop and its tail: 3 × 37 is no multiple of 16), and
// y may be x itself.
TEST(Elementwise, AddInplaceDenseAndAliased) {
  Tensor y({3, 37}), x({3, 37});
  test::fill_uniform(y.mat(), 47);
  test::fill_uniform(x.mat(), 53);
  const Tensor y0 = y;
  add_inplace(y.mat(), x.mat());
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.data()[i], y0.data()[i] + x.data()[i]) << i;
  const Tensor y1 = y;
  add_inplace(y.mat(), y.mat());
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.data()[i], y1.data()[i] + y1.data()[i]) << i;
}

TEST(Elementwise, CopyStrided) {
  Tensor src({3, 5}), dst({3, 6});
  test::fill_uniform(src.mat(), 43);
  dst.fill(-3.0f);
  copy(src.mat().slice_cols(1, 4), dst.mat().slice_cols(2, 4));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 6; ++j)
      EXPECT_EQ(dst.mat().row(i)[j], (j >= 2) ? src.mat().row(i)[j - 1] : -3.0f) << i << ", " << j;
  // Copying a view onto itself is a no-op; empty views are fine.
  const Tensor before = dst;
  copy(dst.mat(), dst.mat());
  for (int64_t i = 0; i < dst.numel(); ++i) EXPECT_EQ(dst[i], before[i]);
  Tensor e({0, 4});
  copy(e.mat(), e.mat());
  add_inplace(e.mat(), e.mat());
}

TEST(Elementwise, ShapeMismatchIsInternalError) {
  Tensor a({2, 3}), b({3, 2});
  try {
    add_inplace(a.mat(), b.mat());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
  }
  EXPECT_THROW(copy(a.mat(), b.mat()), Error);
}

}  // namespace
}  // namespace coc
