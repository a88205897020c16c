// The process's memory (coc/runtime/memory.h): resident figures as /proc reports them, and retain_freed_memory,
// checked by the page faults (getrusage's minor faults) that re-allocating a freed buffer costs.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>

#include "coc/runtime/memory.h"

namespace coc {
namespace {

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// One write per page through a volatile pointer, so that the compiler can neither drop the allocation nor skip a
// page: every page the kernel has not mapped faults once.
void touch_and_free(size_t bytes) {
  void* p = std::malloc(bytes);
  ASSERT_NE(p, nullptr);
  volatile char* c = static_cast<char*>(p);
  for (size_t i = 0; i < bytes; i += 4096) c[i] = 1;
  std::free(p);
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
  const size_t bytes = 24u << 20;
  const long pages = static_cast<long>(bytes / 4096);
  long before = minor_faults();
  touch_and_free(bytes);  // the first time the heap grows: its pages fault in once
  const long first = minor_faults() - before;
  before = minor_faults();
  touch_and_free(bytes);
  const long again = minor_faults() - before;
  // Without retain_freed_memory the second allocation faults every page again (the buffer went back to the kernel).
  // If the first did not fault page by page (transparent huge pages set to "always": one fault per 2 MiB), the
  // second proves nothing.
  if (first < pages / 2)
    GTEST_SKIP() << "the first 24 MiB allocation faulted " << first << " times for " << pages
                 << " pages (huge pages?): nothing to compare";
  EXPECT_LT(again, pages / 8) << again << " page faults re-allocating a freed buffer of " << pages << " pages";
#endif
}

}  // namespace
}  // namespace coc
