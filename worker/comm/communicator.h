#ifndef RECFLEET_WORKER_COMM_COMMUNICATOR_H_
#define RECFLEET_WORKER_COMM_COMMUNICATOR_H_

// Collective communication among the ranks of one group, behind one
// interface with two backends: Gloo (CPU tensors, TCP) and NCCL (CUDA
// tensors). Both are bootstrapped through a KvStore (kv_store.h).
//
// Semantics shared by both backends:
//  - Every rank of the group calls the same collectives in the same order
//    with matching dtypes and sizes.
//  - Every call blocks until its output is complete (NCCL: the call also
//    waits for its CUDA stream) or fails.
//  - No call waits longer than the communicator's timeout: a peer that died
//    or stopped calling makes the others fail with DeadlineExceeded or
//    Unavailable instead of hanging.
//  - After any failure the communicator is broken: its state across ranks
//    is unknown, so every later call fails at once with FailedPrecondition
//    quoting the first error. Recovery is a new communicator from a new
//    rendezvous (a new restart epoch).
//  - Buffers are TensorViews on the backend's device. Sizes are element
//    counts; dtypes fp32, fp64, bf16, int32 and int64 (fp64 on Gloo only:
//    NCCL supports it too, but recfleet keeps fp64 for CPU references).
//
// Not thread-safe: one thread issues the collectives of one communicator.
// Abort() alone may be called from any thread.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/tensor.h"

namespace recfleet {
namespace comm {

enum class ReduceOp { kSum, kAvg, kMin, kMax };

absl::string_view ReduceOpName(ReduceOp op);

struct CommOptions {
  // Bound on every collective and on the rendezvous itself.
  absl::Duration timeout = absl::Seconds(60);
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  Device device() const { return device_; }
  absl::Duration timeout() const { return timeout_; }
  // Backend name for logs: "gloo" or "nccl".
  virtual absl::string_view backend() const = 0;

  // out = concat over ranks of every rank's `in` (n elements in, n*size out).
  absl::Status AllGather(const TensorView& in, const TensorView& out);
  // Reduces `in` (n*size elements) over ranks; rank r receives block r of the
  // result in `out` (n elements).
  absl::Status ReduceScatter(const TensorView& in, const TensorView& out, ReduceOp op);
  // In place: every rank ends with the reduction of everyone's `inout`.
  absl::Status AllReduce(const TensorView& inout, ReduceOp op);
  // Rank r sends the send_counts[p] elements of `in` that follow the first
  // sum(send_counts[0..p)) to rank p, and receives recv_counts[p] elements
  // from rank p into `out` at offset sum(recv_counts[0..p)). Counts may be
  // zero and differ per rank pair; send_counts[p] on rank r must equal
  // recv_counts[r] on rank p. `in` and `out` must not overlap.
  absl::Status AllToAll(const TensorView& in, absl::Span<const int64_t> send_counts,
                        const TensorView& out, absl::Span<const int64_t> recv_counts);
  // In place: every rank ends with `root`'s `inout`.
  absl::Status Broadcast(const TensorView& inout, int root);
  // Returns once every rank has entered the barrier.
  absl::Status Barrier();

  // Breaks the communicator: a collective in flight fails (NCCL at once;
  // Gloo by its timeout at the latest) and every later call fails at once.
  // Thread-safe and idempotent.
  void Abort(absl::string_view reason);

  // OK, or the first error that broke this communicator.
  absl::Status health() const;

 protected:
  Communicator(int rank, int size, Device device, absl::Duration timeout)
      : rank_(rank), size_(size), device_(device), timeout_(timeout) {}

  // Backends implement these on validated arguments.
  virtual absl::Status DoAllGather(const TensorView& in, const TensorView& out) = 0;
  virtual absl::Status DoReduceScatter(const TensorView& in, const TensorView& out, ReduceOp op) = 0;
  virtual absl::Status DoAllReduce(const TensorView& inout, ReduceOp op) = 0;
  virtual absl::Status DoAllToAll(const TensorView& in, absl::Span<const int64_t> send_counts,
                                  const TensorView& out, absl::Span<const int64_t> recv_counts) = 0;
  virtual absl::Status DoBroadcast(const TensorView& inout, int root) = 0;
  virtual absl::Status DoBarrier() = 0;
  // Backend part of Abort(): interrupt what is in flight.
  virtual void DoAbort() {}

 private:
  // Checks that the communicator is healthy; records `status` as the first
  // error if it is not OK.
  absl::Status Guard() const;
  absl::Status Record(absl::Status status, absl::string_view op);

  const int rank_;
  const int size_;
  const Device device_;
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

// Validation shared by the backends, exposed for tests.
absl::Status CheckCollectiveDType(const TensorView& t, absl::string_view what);
bool IsFloatingDType(DType dtype);

}  // namespace comm
}  // namespace recfleet

#endif  // RECFLEET_WORKER_COMM_COMMUNICATOR_H_
