// What this process may run on, and how much shared memory the node has: the facts `coc env` prints and checks
// (edge cases 15-17 of docs/edge-cases.md). Linux only (sched_getaffinity, sysconf, statvfs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace coc {

/// CPU ids this process (its calling thread's affinity mask, which mpirun's binding sets for the whole process)
/// may run on, ascending. Source: sched_getaffinity(0). Throws kInternal if the kernel call fails.
std::vector<int> allowed_cpus();

/// Number of CPUs in allowed_cpus(): the cores a rank can really use, which is what BLAS threads must not exceed.
int allowed_core_count();

/// CPUs online on this node (sysconf(_SC_NPROCESSORS_ONLN)); the ceiling for ranks × threads per node.
int online_core_count();

/// Compact list notation of `cpus`, as taskset -c and /proc/<pid>/status print it: {0} -> "0", {0,1} -> "0-1",
/// {0,2,3,4,7} -> "0,2-4,7", {} -> "". Input need not be sorted; duplicates are ignored.
std::string format_cpu_list(std::vector<int> cpus);

/// The affinity of this process in list notation: format_cpu_list(allowed_cpus()).
std::string affinity_string();

/// Free bytes (available to unprivileged users, f_bavail × f_frsize) in the file system holding `path`.
/// Returns -1 if statvfs fails (for example, no /dev/shm): callers report "unknown" rather than fail.
int64_t free_bytes(const std::string& path);

/// free_bytes("/dev/shm"): the space Open MPI's shared-memory transport (vader) and coc's node-shared windows
/// allocate from. A container's default 64 MiB crashes them with SIGBUS (edge case 17).
int64_t shm_free_bytes();

}  // namespace coc
