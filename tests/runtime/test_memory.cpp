// The process's memory (coc/runtime/memory.h): resident figures as /proc reports them, and retain_freed_memory,
// checked by the page faults (getrusage's minor faults) that re-allocating a freed buffer costs.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <vector>

#include "coc/runtime/memory.h"

namespace coc {
namespace {

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Allocates n floats, writes every one (each page is touched) and frees them.
float touch_and_free(size_t n) {
  std::vector<float> v(n, 1.0f);
  volatile float sink = v[n / 2];
  return sink;
}

TEST(ResidentMemory, PeakIsAtLeastCurrent) {
  const ResidentMemory m = resident_memory();
  if (m.current_bytes == 0) GTEST_SKIP() << "/proc/self/status is not readable here";
  EXPECT_GT(m.current_bytes, 0);
  EXPECT_GE(m.peak_bytes, m.current_bytes);
}

TEST(RetainFreedMemory, AFreedBufferComesBackWithoutPageFaults) {
#if defined(__SANITIZE_ADDRESS__) || !defined(__GLIBC__)
  GTEST_SKIP() << "AddressSanitizer's allocator, or a C library other than glibc: retain_freed_memory does nothing";
#else
  retain_freed_memory();
  // 24 MiB: above glibc's default mmap threshold (128 KiB, raised only by earlier frees), below the 32 MiB cap.
  const size_t n = (24u << 20) / sizeof(float);
  const long pages = static_cast<long>(n * sizeof(float) / 4096);
  touch_and_free(n);  // the first time the heap grows: its pages fault in once
  const long before = minor_faults();
  touch_and_free(n);
  const long again = minor_faults() - before;
  // Without retain_freed_memory each of the 6144 pages faults again (the buffer went back to the kernel).
  EXPECT_LT(again, pages / 8) << again << " page faults re-allocating a freed buffer of " << pages << " pages";
#endif
}

}  // namespace
}  // namespace coc
