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
//    waits for its CUDA stream) or fails; except the Start* calls, which
//    return a PendingCollective at once (see there).
//  - A communicator runs its collectives in issue order, started ones
//    included: a blocking call issued after a Start* runs after it.
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
//
// Started collectives: Gloo runs them, in issue order, on a thread the
// communicator owns (a Gloo context serves one thread at a time: the
// blocking calls wait until the started ones are done before they touch
// it), so they overlap the caller's computation and the collectives of
// other communicators. NCCL enqueues them on a second, non-blocking stream
// of the communicator, after the work queued so far on the legacy default
// stream (a CUDA event), so they overlap the kernels queued after them; the
// host does not wait for them unless asked to (PendingCollective::Wait).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/tensor.h"

namespace recfleet {
namespace comm {

enum class ReduceOp { kSum, kAvg, kMin, kMax };

// A collective started by Communicator::StartAllGather & co. Its buffers
// must stay alive, and its inputs unchanged, until Wait() returned (or the
// handle is destroyed, which waits for it). Methods are called by the
// thread that started it.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  // Orders the caller's next work after the collective, blocking the host
  // only where the backend has to: Gloo waits for it (as Wait); NCCL makes
  // work enqueued afterwards on the legacy default stream wait for it on
  // the device and returns at once. An error here or from Wait breaks the
  // communicator as any failed collective does.
  virtual absl::Status Ready() = 0;
  // Blocks the host until the collective finished, failed, or ran past the
  // communicator's timeout (which aborts it, as for a blocking call).
  virtual absl::Status Wait() = 0;
};

// The handle of a collective that has finished with `status` (for
// backends: one that ran at once, or failed before it was enqueued).
std::unique_ptr<PendingCollective> FinishedCollective(absl::Status status);

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

  // The same collectives, started without waiting for them (validation
  // errors and a broken communicator are reported here, at once; failures
  // of the collective itself by the handle). Every rank starts them in the
  // same order as its other collectives of this communicator.
  absl::StatusOr<std::unique_ptr<PendingCollective>> StartAllGather(const TensorView& in, const TensorView& out);
  absl::StatusOr<std::unique_ptr<PendingCollective>> StartReduceScatter(const TensorView& in, const TensorView& out,
                                                                        ReduceOp op);
  absl::StatusOr<std::unique_ptr<PendingCollective>> StartAllReduce(const TensorView& inout, ReduceOp op);

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
  // Starts `run` (one of the Do* calls above on validated arguments, whose
  // result is already recorded) after the collectives issued before it.
  // The default runs it here and returns a finished handle; backends that
  // overlap override it (see the class comment).
  virtual std::unique_ptr<PendingCollective> DoStart(std::function<absl::Status()> run);
  // Called before every blocking collective: orders it after the started
  // ones (Gloo: waits for them; NCCL: its stream waits for them).
  virtual absl::Status AfterStarted() { return absl::OkStatus(); }
  // Records `status` as the first error if it is not OK and returns it
  // annotated with the backend, `op` and this rank. Thread-safe.
  absl::Status Record(absl::Status status, absl::string_view op);

 private:
  // Checks that the communicator is healthy; records `status` as the first
  // error if it is not OK.
  absl::Status Guard() const;
  // Guard, the check `valid` (validation of the arguments) and DoStart.
  absl::StatusOr<std::unique_ptr<PendingCollective>> Start(absl::string_view op, absl::Status valid,
                                                           std::function<absl::Status()> run);

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
