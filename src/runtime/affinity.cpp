#include "coc/runtime/affinity.h"

#include <sched.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "coc/core/error.h"

namespace coc {

std::vector<int> allowed_cpus() {
  // A fixed cpu_set_t holds 1024 CPUs; a bigger machine makes sched_getaffinity fail with EINVAL, so grow a
  // dynamically sized set until it fits.
  for (int ncpu = CPU_SETSIZE; ncpu <= (1 << 20); ncpu *= 2) {
    cpu_set_t* set = CPU_ALLOC(ncpu);
    if (!set) throw_error(ErrorKind::kInternal, "CPU_ALLOC({}) failed", ncpu);
    const size_t bytes = CPU_ALLOC_SIZE(ncpu);
    CPU_ZERO_S(bytes, set);
    if (sched_getaffinity(0, bytes, set) == 0) {
      std::vector<int> out;
      for (int c = 0; c < ncpu; ++c)
        if (CPU_ISSET_S(c, bytes, set)) out.push_back(c);
      CPU_FREE(set);
      return out;
    }
    const int err = errno;
    CPU_FREE(set);
    if (err != EINVAL) throw_error(ErrorKind::kInternal, "sched_getaffinity failed: {}", std::strerror(err));
  }
  throw_error(ErrorKind::kInternal, "sched_getaffinity: more than 2^20 CPUs?");
}

int allowed_core_count() { return static_cast<int>(allowed_cpus().size()); }

int online_core_count() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

std::string format_cpu_list(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

std::string affinity_string() { return format_cpu_list(allowed_cpus()); }

int64_t free_bytes(const std::string& path) {
  struct statvfs st {};
  if (statvfs(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

int64_t shm_free_bytes() { return free_bytes("/dev/shm"); }

}  // namespace coc
