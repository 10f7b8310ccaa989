#ifndef RECFLEET_WORKER_DIST_EQUIVALENCE_TESTING_H_
#define RECFLEET_WORKER_DIST_EQUIVALENCE_TESTING_H_

// Distributed training vs one rank, independent of the backend: `world`
// ranks (FSDP groups of `fsdp_size`, replicas across them; three embedding
// tables sharded over the FSDP group, two table-wise and one row-wise, with
// sum and mean pooling; uneven local batches) train a linear model over
// dense features and the pooled embeddings for 20 steps on the same global
// batches as a single host rank holding everything. Checks with gtest
// expectations that every step's embeddings match (1e-5) and that the final
// dense parameters and tables match (relative error < 1e-5, fp32), with
// replicas bit-identical. Dense optimizer: SGD or Adam; tables: rowwise
// Adagrad.

#include <functional>

#include "worker/comm/conformance.h"
#include "worker/comm/process_groups.h"

namespace recfleet {
namespace dist {

enum class DenseOptimizer { kSgd, kAdam };

// `factory_for_rank(rank)` connects that rank's communicators (Gloo, or
// NCCL on GPU `rank`); `memory` is where the communicators' buffers live.
void CheckDistributedEquivalence(int world, int fsdp_size, DenseOptimizer opt, comm::TestMemory& memory,
                                 const std::function<comm::CommFactory(int rank)>& factory_for_rank);

}  // namespace dist
}  // namespace recfleet

#endif  // RECFLEET_WORKER_DIST_EQUIVALENCE_TESTING_H_
