#ifndef RECFLEET_WORKER_DIST_FSDP_TESTING_H_
#define RECFLEET_WORKER_DIST_FSDP_TESTING_H_

// A backend-independent FSDP check, run by the Gloo test on threads and by
// the NCCL test on GPUs: `world` ranks in FSDP groups of `fsdp_size`, each
// connecting through `factory_for_rank(rank)`; gathers and gradient
// reductions (sum and mean), blocking and started, are compared with their
// definitions.

#include <functional>

#include "worker/comm/conformance.h"
#include "worker/comm/process_groups.h"

namespace recfleet {
namespace dist {

void CheckFsdpGatherAndReduce(int world, int fsdp_size, comm::TestMemory& memory,
                              const std::function<comm::CommFactory(int rank)>& factory_for_rank);

}  // namespace dist
}  // namespace recfleet

#endif  // RECFLEET_WORKER_DIST_FSDP_TESTING_H_
