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

}  // namespace coc
