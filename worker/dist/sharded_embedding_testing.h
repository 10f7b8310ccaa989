#ifndef RECFLEET_WORKER_DIST_SHARDED_EMBEDDING_TESTING_H_
#define RECFLEET_WORKER_DIST_SHARDED_EMBEDDING_TESTING_H_

// A backend-independent check of ShardedEmbeddingCollection, run by the
// Gloo test on threads and by the NCCL test on GPUs: one Forward and one
// BackwardAndUpdate over `group` ranks (four tables: row-wise sum over
// every rank, row-wise mean over a subset, a table-wise per-token lookup,
// column-wise mean over every rank in reverse order; uneven bag counts,
// empty bags, repeated ids) against the embedding kernels on whole host
// tables.

#include "worker/comm/conformance.h"
#include "worker/comm/process_groups.h"

namespace recfleet {
namespace dist {

// `connect(store, rank, size)` joins rank `rank` of the group; `memory`
// holds the outputs and gradients (the communicators' device).
using GroupConnector = comm::CommFactory;
void CheckAgainstWholeTables(int group, comm::TestMemory& memory, const GroupConnector& connect);

}  // namespace dist
}  // namespace recfleet

#endif  // RECFLEET_WORKER_DIST_SHARDED_EMBEDDING_TESTING_H_
