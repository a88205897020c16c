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
/// (activations, FSDP's gathered parameters and full gradients, the ring's K/V blocks). glibc hands chunks above its
/// mmap threshold back to the kernel on free, and trims the heap's top above 128 KB, so each step page-faulted them
/// in again: on the test VM that costs ~4 ms per MiB (56 MiB of fresh buffers took 220 ms, the same buffers re-used
/// 1-3 ms), which the profile showed as 100-150 ms of idle time before each ring-attention backward. This is what
/// PyTorch's caching allocators do for devices, and why IPEX recommends jemalloc or tcmalloc on CPUs. Sets glibc's
/// mmap threshold to its maximum (32 MiB: larger buffers still come from and return to the kernel) and its trim
/// threshold to 2 GiB; resident memory then stays near its peak, which "peak RSS" reports anyway. Call once, before
/// the first large allocation and before any thread starts. Does nothing on a C library other than glibc.
void retain_freed_memory();

}  // namespace coc
