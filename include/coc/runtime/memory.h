// This process's resident memory, as the kernel counts it (/proc/self/status): what a "memory per rank" figure
// reports. Resident bytes include everything the rank touched (MPI's buffers, the BLAS library), so a feature's own
// memory is the growth of the peak over a baseline read just before it allocates.
#pragma once

#include <cstdint>

namespace coc {

struct ResidentMemory {
  int64_t current_bytes = 0;  ///< VmRSS: resident now
  int64_t peak_bytes = 0;     ///< VmHWM: the high-water mark since the process started
};

/// Reads VmRSS and VmHWM. Both are 0 where /proc is not mounted (the figure is then "unknown", never an error).
ResidentMemory resident_memory();

/// Keeps freed heap memory in the process, so that a buffer of the size freed a moment ago is allocated again without
/// the kernel faulting its pages in. A training step frees and re-allocates the same large buffers every time
/// (activations, FSDP's gathered parameters and full gradients, the ring's K/V blocks, the MoE token buffers), and
/// glibc hands large freed chunks back to the kernel; on a VM where a page fault is slow that showed as idle time
/// and as slower compute in every profile (measured: docs/performance.md, point 14). PyTorch's caching allocators do
/// this for devices; IPEX recommends jemalloc or tcmalloc on CPUs for the same reason.
///
/// Sets glibc's mmap threshold to 32 MiB, its maximum on 64-bit (larger buffers still come from, and go back to,
/// the kernel), and its trim threshold to 2 GiB; setting them also stops glibc from moving them. UCX, which Open MPI
/// and MPICH may load in MPI_Init, moves them too when its memory hooks see a free (UCX_MEM_DYNAMIC_MMAP_THRESH):
/// this sets that variable to n unless the caller set it. Call it before MPI_Init, and again after. Resident memory
/// then stays near its peak, which "peak RSS" reports anyway. Does nothing on a C library other than glibc.
void retain_freed_memory();

}  // namespace coc
