// CPU affinity and /dev/shm queries (coc/runtime/affinity.h), checked against what the kernel reports through
// /proc/self/status and sched_getaffinity, and against a mask this test sets itself.
#include <gtest/gtest.h>
#include <sched.h>

#include <fstream>
#include <string>

#include "coc/runtime/affinity.h"

namespace coc {
namespace {

TEST(Affinity, FormatCpuList) {
  EXPECT_EQ(format_cpu_list({}), "");
  EXPECT_EQ(format_cpu_list({0}), "0");
  EXPECT_EQ(format_cpu_list({0, 1}), "0-1");
  EXPECT_EQ(format_cpu_list({0, 2, 3, 4, 7}), "0,2-4,7");
  EXPECT_EQ(format_cpu_list({7, 3, 2, 4, 0, 3}), "0,2-4,7");  // unsorted, duplicate
  EXPECT_EQ(format_cpu_list({5, 9}), "5,9");
}

TEST(Affinity, MatchesProcSelfStatus) {
  // The kernel prints the same list notation as Cpus_allowed_list.
  std::ifstream f("/proc/self/status");
  std::string line, list;
  while (std::getline(f, line))
    if (line.rfind("Cpus_allowed_list:", 0) == 0) list = line.substr(line.find_first_not_of(" \t", 18));
  ASSERT_FALSE(list.empty());
  EXPECT_EQ(affinity_string(), list);
  EXPECT_EQ(allowed_core_count(), static_cast<int>(allowed_cpus().size()));
  EXPECT_GE(allowed_core_count(), 1);
  EXPECT_LE(allowed_core_count(), online_core_count());
}

TEST(Affinity, FollowsSchedSetaffinity) {
  // Bind this thread to its first allowed CPU, check, then restore: the result is what mpirun --bind-to core
  // would produce. allowed_cpus() reads the calling thread's mask.
  cpu_set_t old;
  ASSERT_EQ(sched_getaffinity(0, sizeof old, &old), 0);
  const int first = allowed_cpus().front();
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  EXPECT_EQ(allowed_cpus(), std::vector<int>{first});
  EXPECT_EQ(affinity_string(), std::to_string(first));
  EXPECT_EQ(allowed_core_count(), 1);
  ASSERT_EQ(sched_setaffinity(0, sizeof old, &old), 0);
}

TEST(Affinity, ShmFreeBytes) {
  EXPECT_GT(shm_free_bytes(), 0) << "no /dev/shm on this machine?";
  EXPECT_EQ(free_bytes("/nonexistent/path"), -1);
  EXPECT_GT(free_bytes("/"), 0);
}

}  // namespace
}  // namespace coc
