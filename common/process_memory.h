#ifndef RECFLEET_COMMON_PROCESS_MEMORY_H_
#define RECFLEET_COMMON_PROCESS_MEMORY_H_

// The calling process's resident memory as the kernel counts it (Linux
// /proc/self/status): what a CPU rank's "peak memory" means, and what its
// prediction is checked against. Resident bytes include the process's code
// and libraries (a worker links cuBLASLt, whose pages alone are ~140 MB),
// every thread's heap and stacks, and whatever the allocator keeps after a
// free.
//
// Thread-safe (reads of /proc); ResetPeakResident affects the whole process.

#include <cstdint>

#include "absl/status/statusor.h"

namespace recfleet {

// VmRSS: resident bytes now.
absl::StatusOr<int64_t> ResidentBytes();
// VmHWM: the highest resident bytes since the process started or since the
// last ResetPeakResident.
absl::StatusOr<int64_t> PeakResidentBytes();
// Returns the heap's free memory to the kernel (malloc_trim), so resident
// bytes count what is live, then restarts the peak from the resident bytes
// now (/proc/self/clear_refs "5"). FailedPrecondition when the kernel
// refuses the reset.
absl::Status ResetPeakResident();

}  // namespace recfleet

#endif  // RECFLEET_COMMON_PROCESS_MEMORY_H_
