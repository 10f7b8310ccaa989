#ifndef RECFLEET_WORKER_COMM_NCCL_COMMUNICATOR_H_
#define RECFLEET_WORKER_COMM_NCCL_COMMUNICATOR_H_

// The GPU backend: collectives over NCCL on CUDA tensors, one rank per GPU.
//
// Failure behavior: the communicator is created non-blocking, so no NCCL
// call can block the host. Every collective is enqueued on the
// communicator's own stream and then polled (stream completion and NCCL's
// asynchronous error) until it finishes, fails, or the timeout passes; a
// timeout or an asynchronous error calls ncclCommAbort, which frees the
// peers of this rank as well, and breaks the communicator. Abort() from
// another thread makes the polling thread abort the communicator at once.
//
// Ordering: each collective runs on the communicator's own stream, which
// waits for work queued earlier on the legacy default stream (so inputs
// written there, or by cudaMemcpy, are complete), and the call returns only
// after that stream finished, so its outputs are ready for any stream.
// Started collectives (Communicator::Start*) run on a second stream, a
// non-blocking one, after an event recorded on the legacy default stream
// when they are started; PendingCollective::Ready makes the legacy stream
// wait for one (an event, no host wait), Wait polls its event like a
// blocking call polls its stream. A blocking call issued after them waits
// for them on the device.
//
// Rendezvous: rank 0 creates the NCCL unique id and publishes it in the
// store under "nccl_unique_id"; the others wait for it (bounded by the
// timeout), so a rank that never arrives fails the others' ConnectNccl.

#include <memory>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/comm/kv_store.h"

namespace recfleet {
namespace comm {

// Joins the group of `size` ranks as `rank`, on CUDA device `cuda_device`.
// The calling thread's current device is set to `cuda_device`; collectives
// may be issued from any thread (one at a time) and set it again.
absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(KvStore& store, int rank, int size, int cuda_device,
                                                          const CommOptions& options);

}  // namespace comm
}  // namespace recfleet

#endif  // RECFLEET_WORKER_COMM_NCCL_COMMUNICATOR_H_
