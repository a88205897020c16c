#include "coc/runtime/memory.h"

#include <cstdio>
#include <cstring>

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

}  // namespace coc
