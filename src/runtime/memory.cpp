#include "coc/runtime/memory.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace coc {

ResidentMemory resident_memory() {
  ResidentMemory m;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return m;
  char line[256];
  while (std::fgets(line, sizeof line, f)) {
    long long kib = 0;
    if (std::sscanf(line, "VmRSS: %lld kB", &kib) == 1) m.current_bytes = kib * 1024;
    if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1) m.peak_bytes = kib * 1024;
  }
  std::fclose(f);
  return m;
}

void retain_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
  setenv("UCX_MEM_DYNAMIC_MMAP_THRESH", "n", 0);
#endif
}

}  // namespace coc
