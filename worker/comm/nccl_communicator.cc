#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace recfleet {
namespace comm {
namespace {

constexpr char kUniqueIdKey[] = "nccl_unique_id";

absl::Status CudaError(cudaError_t err, absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

absl::Status NcclError(ncclResult_t res, ncclComm_t comm, absl::string_view what) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  const std::string detail = last != nullptr && *last != '\0' ? absl::StrCat(" (", last, ")") : "";
  const absl::StatusCode code =
      res == ncclRemoteError || res == ncclSystemError ? absl::StatusCode::kUnavailable : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(what, ": ", ncclGetErrorString(res), detail));
}

ncclDataType_t ToNccl(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return ncclFloat64;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kFloat32:
    default: return ncclFloat32;  // Other dtypes are rejected before any call.
  }
}

ncclRedOp_t ToNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kSum:
    default: return ncclSum;
  }
}

// Polls until a non-blocking communicator leaves ncclInProgress (after init
// or an enqueue), or the deadline passes.
absl::Status WaitForComm(ncclComm_t comm, absl::Time deadline, const std::atomic<bool>& abort_requested,
                         absl::string_view what) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t res = ncclCommGetAsyncError(comm, &state);
    if (res != ncclSuccess) return NcclError(res, comm, what);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclError(state, comm, what);
    if (abort_requested.load()) return absl::AbortedError(absl::StrCat(what, ": aborted"));
    if (absl::Now() >= deadline) return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    std::this_thread::yield();
  }
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(int rank, int size, int cuda_device, absl::Duration timeout, ncclComm_t comm,
                   cudaStream_t stream, int* scratch)
      : Communicator(rank, size, Device::kCuda, timeout),
        cuda_device_(cuda_device),
        comm_(comm),
        stream_(stream),
        scratch_(scratch) {}

  ~NcclCommunicator() override {
    cudaSetDevice(cuda_device_);
    if (!aborted_) {
      bool clean = health().ok();
      if (clean) {
        // Finalize flushes outstanding work; bounded like any collective.
        const ncclResult_t res = ncclCommFinalize(comm_);
        clean = (res == ncclSuccess || res == ncclInProgress) &&
                WaitForComm(comm_, absl::Now() + timeout(), abort_requested_, "finalize").ok();
      }
      if (clean) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
    }
    cudaStreamDestroy(stream_);
    if (side_ != nullptr) cudaStreamDestroy(side_);
    if (issued_ != nullptr) cudaEventDestroy(issued_);
    if (last_started_ != nullptr) cudaEventDestroy(last_started_);
    cudaFree(scratch_);
  }

  absl::string_view backend() const override { return "nccl"; }

 protected:
  absl::Status DoAllGather(const TensorView& in, const TensorView& out) override {
    if (in.numel() == 0) return absl::OkStatus();
    return Run("ncclAllGather", [&] {
      return ncclAllGather(in.data, out.data, in.numel(), ToNccl(in.dtype), comm_, launch_stream());
    });
  }

  absl::Status DoReduceScatter(const TensorView& in, const TensorView& out, ReduceOp op) override {
    if (out.numel() == 0) return absl::OkStatus();
    return Run("ncclReduceScatter", [&] {
      return ncclReduceScatter(in.data, out.data, out.numel(), ToNccl(in.dtype), ToNccl(op), comm_, launch_stream());
    });
  }

  absl::Status DoAllReduce(const TensorView& inout, ReduceOp op) override {
    if (inout.numel() == 0) return absl::OkStatus();
    return Run("ncclAllReduce", [&] {
      return ncclAllReduce(inout.data, inout.data, inout.numel(), ToNccl(inout.dtype), ToNccl(op), comm_, launch_stream());
    });
  }

  absl::Status DoAllToAll(const TensorView& in, absl::Span<const int64_t> send_counts, const TensorView& out,
                          absl::Span<const int64_t> recv_counts) override {
    const size_t width = DTypeSize(in.dtype);
    const ncclDataType_t type = ToNccl(in.dtype);
    return Run("all_to_all (ncclSend/ncclRecv)", [&] {
      ncclResult_t res = ncclGroupStart();
      if (res != ncclSuccess) return res;
      size_t send_offset = 0, recv_offset = 0;
      for (int p = 0; p < size(); ++p) {
        if (send_counts[p] > 0) {
          res = ncclSend(static_cast<const char*>(in.data) + send_offset * width, send_counts[p], type, p, comm_,
                         launch_stream());
          if (res != ncclSuccess && res != ncclInProgress) break;
        }
        if (recv_counts[p] > 0) {
          res = ncclRecv(static_cast<char*>(out.data) + recv_offset * width, recv_counts[p], type, p, comm_,
                         launch_stream());
          if (res != ncclSuccess && res != ncclInProgress) break;
        }
        send_offset += send_counts[p];
        recv_offset += recv_counts[p];
      }
      ncclResult_t end = ncclGroupEnd();
      return res != ncclSuccess && res != ncclInProgress ? res : end;
    });
  }

  absl::Status DoBroadcast(const TensorView& inout, int root) override {
    if (inout.numel() == 0) return absl::OkStatus();
    return Run("ncclBroadcast", [&] {
      return ncclBroadcast(inout.data, inout.data, inout.numel(), ToNccl(inout.dtype), root, comm_, launch_stream());
    });
  }

  // A one-element all-reduce: nobody's completes before everyone entered.
  absl::Status DoBarrier() override {
    return Run("barrier (ncclAllReduce)",
               [&] { return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, launch_stream()); });
  }

  void DoAbort() override { abort_requested_.store(true); }

  std::unique_ptr<PendingCollective> DoStart(std::function<absl::Status()> run) override;

  // Blocking collectives run after the started ones: the blocking stream
  // waits for the side stream's last collective.
  absl::Status AfterStarted() override {
    if (!any_started_) return absl::OkStatus();
    const cudaError_t err = cudaStreamWaitEvent(stream_, last_started_, 0);
    return err == cudaSuccess ? absl::OkStatus() : CudaError(err, "order after started collectives");
  }


 public:
  // Polls until `done` (recorded after a started collective) has passed,
  // as a blocking collective polls its stream; aborts the communicator on
  // failure.
  absl::Status WaitEvent(cudaEvent_t done) {
    if (aborted_) return Record(absl::FailedPreconditionError("communicator was aborted"), "wait");
    absl::Status s = Poll("started collective", absl::Now() + timeout(), [done] { return cudaEventQuery(done); });
    if (!s.ok() && !aborted_) {
      ncclCommAbort(comm_);
      aborted_ = true;
    }
    return Record(std::move(s), "wait");
  }
  int cuda_device() const { return cuda_device_; }

 private:
  // The stream a collective enqueues on: the side stream while DoStart
  // runs it.
  cudaStream_t launch_stream() const { return starting_ ? side_ : stream_; }
  // Creates the side stream and its events at the first started collective.
  absl::Status PrepareSide() {
    if (side_ != nullptr) return absl::OkStatus();
    cudaError_t err = cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&issued_, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&last_started_, cudaEventDisableTiming);
    return err == cudaSuccess ? absl::OkStatus() : CudaError(err, "side stream for started collectives");
  }

  // Enqueues with `launch`, then polls to completion within the timeout. On
  // any failure the communicator is aborted here, on the calling thread, so
  // that NCCL's resources are never freed under a concurrent call.
  template <typename Launch>
  absl::Status Run(absl::string_view what, Launch&& launch) {
    absl::Status s = RunUnchecked(what, launch);
    if (!s.ok() && !aborted_) {
      ncclCommAbort(comm_);
      aborted_ = true;
    }
    return s;
  }

  template <typename Launch>
  absl::Status RunUnchecked(absl::string_view what, Launch& launch) {
    if (aborted_) return absl::FailedPreconditionError("communicator was aborted");
    const absl::Time deadline = absl::Now() + timeout();
    cudaError_t err = cudaSetDevice(cuda_device_);
    if (err != cudaSuccess) return CudaError(err, "cudaSetDevice");
    ncclResult_t res = launch();
    if (res != ncclSuccess && res != ncclInProgress) return NcclError(res, comm_, what);
    if (absl::Status s = WaitForComm(comm_, deadline, abort_requested_, what); !s.ok()) return s;
    // A started collective is only enqueued here; its handle waits for it.
    if (starting_) return absl::OkStatus();
    return Poll(what, deadline, [this] { return cudaStreamQuery(stream_); });
  }

  // Polls `query` (cudaStreamQuery / cudaEventQuery) until it reports
  // completion, an error, NCCL's asynchronous error, an abort request, or
  // the deadline.
  template <typename Query>
  absl::Status Poll(absl::string_view what, absl::Time deadline, Query&& query) {
    while (true) {
      cudaError_t err = query();
      if (err == cudaSuccess) return absl::OkStatus();
      if (err != cudaErrorNotReady) return CudaError(err, absl::StrCat(what, ": stream"));
      ncclResult_t state = ncclSuccess;
      ncclResult_t res = ncclCommGetAsyncError(comm_, &state);
      if (res != ncclSuccess) return NcclError(res, comm_, what);
      if (state != ncclSuccess && state != ncclInProgress) return NcclError(state, comm_, what);
      if (abort_requested_.load()) return absl::AbortedError(absl::StrCat(what, ": aborted while in flight"));
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(what, ": not complete after ", absl::FormatDuration(timeout()),
                                                        " (a peer died or stopped calling)"));
      }
      std::this_thread::yield();
    }
  }

  const int cuda_device_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  int* scratch_;
  std::atomic<bool> abort_requested_{false};
  bool aborted_ = false;
  // Started collectives: the side stream (non-blocking, so the legacy
  // default stream's later kernels do not wait for it), an event marking
  // what the legacy stream had queued when one was started, and one after
  // the last of them. Created at the first.
  cudaStream_t side_ = nullptr;
  cudaEvent_t issued_ = nullptr, last_started_ = nullptr;
  bool starting_ = false;  // DoStart is launching on side_.
  bool any_started_ = false;
};

// A collective on the side stream; `done` is recorded after it.
class NcclPending : public PendingCollective {
 public:
  NcclPending(NcclCommunicator* comm, cudaEvent_t done) : comm_(comm), done_(done) {}
  // Waits for the collective (the handle's contract: its buffers may be
  // freed once it is gone), then frees its event. A broken communicator was
  // aborted, which ends its kernels: nothing left to wait for.
  ~NcclPending() override {
    if (comm_->health().ok()) cudaEventSynchronize(done_);
    cudaEventDestroy(done_);
  }
  absl::Status Ready() override {
    if (absl::Status s = comm_->health(); !s.ok()) return s;
    cudaError_t err = cudaSetDevice(comm_->cuda_device());
    if (err == cudaSuccess) err = cudaStreamWaitEvent(cudaStreamLegacy, done_, 0);
    return err == cudaSuccess ? absl::OkStatus() : CudaError(err, "order after a started collective");
  }
  absl::Status Wait() override { return comm_->WaitEvent(done_); }

 private:
  NcclCommunicator* comm_;
  cudaEvent_t done_;
};

std::unique_ptr<PendingCollective> NcclCommunicator::DoStart(std::function<absl::Status()> run) {
  cudaError_t err = cudaSetDevice(cuda_device_);
  absl::Status s = err == cudaSuccess ? PrepareSide() : CudaError(err, "cudaSetDevice");
  // The side stream waits for the inputs the legacy default stream was
  // computing when the collective was started.
  if (s.ok()) {
    err = cudaEventRecord(issued_, cudaStreamLegacy);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(side_, issued_, 0);
    if (err != cudaSuccess) s = CudaError(err, "order a started collective");
  }
  cudaEvent_t done = nullptr;
  if (s.ok()) {
    err = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (err != cudaSuccess) s = CudaError(err, "event of a started collective");
  }
  if (!s.ok()) return FinishedCollective(Record(std::move(s), "start"));
  starting_ = true;
  s = run();
  starting_ = false;
  if (s.ok()) {
    err = cudaEventRecord(done, side_);
    if (err == cudaSuccess) err = cudaEventRecord(last_started_, side_);
    if (err != cudaSuccess) s = Record(CudaError(err, "record a started collective"), "start");
  }
  if (!s.ok()) {
    cudaEventDestroy(done);
    return FinishedCollective(std::move(s));
  }
  any_started_ = true;
  return std::make_unique<NcclPending>(this, done);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(KvStore& store, int rank, int size, int cuda_device,
                                                          const CommOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: rank ", rank, " is not in [0, size=", size, ")"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("nccl: options.timeout must be positive");
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  const std::string where = absl::StrCat("nccl rendezvous (rank ", rank, "/", size, ", device ", cuda_device, ")");
  cudaError_t err = cudaSetDevice(cuda_device);
  if (err != cudaSuccess) return CudaError(err, absl::StrCat(where, ": cudaSetDevice"));

  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t res = ncclGetUniqueId(&id);
    if (res != ncclSuccess) return NcclError(res, nullptr, absl::StrCat(where, ": ncclGetUniqueId"));
    absl::Status s = store.Set(kUniqueIdKey, absl::string_view(id.internal, sizeof(id.internal)));
    if (!s.ok()) return s;
  } else {
    absl::StatusOr<std::string> value = WaitAndGet(store, kUniqueIdKey, options.timeout);
    if (!value.ok()) {
      return absl::Status(value.status().code(), absl::StrCat(where, ": ", value.status().message()));
    }
    if (value->size() != sizeof(id.internal)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": key '", kUniqueIdKey, "' holds ", value->size(),
                                                     " bytes, expected ", sizeof(id.internal)));
    }
    std::memcpy(id.internal, value->data(), sizeof(id.internal));
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t res = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (res != ncclSuccess && res != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return NcclError(res, nullptr, absl::StrCat(where, ": ncclCommInitRankConfig"));
  }
  std::atomic<bool> never{false};
  if (absl::Status s = WaitForComm(comm, deadline, never, absl::StrCat(where, ": init")); !s.ok()) {
    ncclCommAbort(comm);
    return s;
  }

  cudaStream_t stream = nullptr;
  int* scratch = nullptr;
  // A blocking stream, on purpose: its work waits for work queued before it
  // on the legacy default stream, which includes the tail of a cudaMemcpy
  // from pageable memory (that call may return before its DMA lands). So a
  // buffer filled by cudaMemcpy or a kernel on the default stream is safe
  // to pass to a collective right away.
  err = cudaStreamCreateWithFlags(&stream, cudaStreamDefault);
  if (err == cudaSuccess) err = cudaMalloc(&scratch, sizeof(int));
  if (err == cudaSuccess) err = cudaMemset(scratch, 0, sizeof(int));
  if (err != cudaSuccess) {
    if (stream != nullptr) cudaStreamDestroy(stream);
    ncclCommAbort(comm);
    return CudaError(err, absl::StrCat(where, ": stream/scratch"));
  }
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(rank, size, cuda_device, options.timeout, comm, stream, scratch));
}

}  // namespace comm
}  // namespace recfleet
