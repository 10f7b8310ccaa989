#include "worker/comm/communicator.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace recfleet {
namespace comm {

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
  }
  return "unknown";
}

bool IsFloatingDType(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kBFloat16;
}

absl::Status CheckCollectiveDType(const TensorView& t, absl::string_view what) {
  return CheckDType(t, what, {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kInt32, DType::kInt64});
}

namespace {

absl::Status CheckBuffer(const TensorView& t, absl::string_view what, Device device) {
  if (absl::Status s = CheckCollectiveDType(t, what); !s.ok()) return s;
  if (absl::Status s = CheckDevice(t, what, device); !s.ok()) return s;
  if (t.data == nullptr && t.numel() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null data for ", t.numel(), " elements"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameDType(const TensorView& a, const TensorView& b) {
  if (a.dtype != b.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("in is ", DTypeName(a.dtype), " but out is ",
                                                   DTypeName(b.dtype), "; they must match"));
  }
  return absl::OkStatus();
}

absl::Status CheckOp(const TensorView& t, ReduceOp op) {
  if (op == ReduceOp::kAvg && !IsFloatingDType(t.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce op avg needs a floating dtype (fp32, fp64, bf16), got ", DTypeName(t.dtype)));
  }
  return absl::OkStatus();
}

bool Overlap(const TensorView& a, const TensorView& b) {
  const char* a0 = static_cast<const char*>(a.data);
  const char* b0 = static_cast<const char*>(b.data);
  return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

absl::Status CheckCounts(absl::Span<const int64_t> counts, int size, int64_t numel, absl::string_view what,
                         absl::string_view buffer) {
  if (static_cast<int>(counts.size()) != size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has ", counts.size(), " entries; expected one per rank (", size, ")"));
  }
  int64_t total = 0;
  for (size_t p = 0; p < counts.size(); ++p) {
    if (counts[p] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", p, "] = ", counts[p], " is negative"));
    }
    total += counts[p];
  }
  if (total > numel) {
    return absl::InvalidArgumentError(absl::StrCat(what, " sum to ", total, " elements but ", buffer,
                                                   " holds only ", numel));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Communicator::health() const {
  absl::MutexLock lock(&mu_);
  return broken_;
}

absl::Status Communicator::Guard() const {
  absl::MutexLock lock(&mu_);
  if (broken_.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(backend(), " communicator (rank ", rank_, "/", size_, ") is broken by an earlier error: ",
                   broken_.ToString()));
}

absl::Status Communicator::Record(absl::Status status, absl::string_view op) {
  if (status.ok()) return status;
  absl::Status annotated(status.code(), absl::StrCat(backend(), " ", op, " (rank ", rank_, "/", size_,
                                                     "): ", status.message()));
  {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) broken_ = annotated;
  }
  return annotated;
}

void Communicator::Abort(absl::string_view reason) {
  {
    absl::MutexLock lock(&mu_);
    if (broken_.ok()) broken_ = absl::AbortedError(absl::StrCat("aborted: ", reason));
  }
  DoAbort();
}

namespace {

absl::Status CheckAllGather(const TensorView& in, const TensorView& out, Device device, int size) {
  if (absl::Status s = CheckBuffer(in, "all_gather in", device); !s.ok()) return s;
  if (absl::Status s = CheckBuffer(out, "all_gather out", device); !s.ok()) return s;
  if (absl::Status s = CheckSameDType(in, out); !s.ok()) return s;
  if (out.numel() != in.numel() * size) {
    return absl::InvalidArgumentError(absl::StrCat("all_gather: out has ", out.numel(),
                                                   " elements; expected in.numel() * size = ", in.numel() * size));
  }
  return absl::OkStatus();
}

absl::Status CheckReduceScatter(const TensorView& in, const TensorView& out, ReduceOp op, Device device, int size) {
  if (absl::Status s = CheckBuffer(in, "reduce_scatter in", device); !s.ok()) return s;
  if (absl::Status s = CheckBuffer(out, "reduce_scatter out", device); !s.ok()) return s;
  if (absl::Status s = CheckSameDType(in, out); !s.ok()) return s;
  if (absl::Status s = CheckOp(in, op); !s.ok()) return s;
  if (in.numel() != out.numel() * size) {
    return absl::InvalidArgumentError(absl::StrCat("reduce_scatter: in has ", in.numel(),
                                                   " elements; expected out.numel() * size = ", out.numel() * size));
  }
  if (Overlap(in, out)) return absl::InvalidArgumentError("reduce_scatter: in and out overlap");
  return absl::OkStatus();
}

absl::Status CheckAllReduce(const TensorView& inout, ReduceOp op, Device device) {
  if (absl::Status s = CheckBuffer(inout, "all_reduce inout", device); !s.ok()) return s;
  return CheckOp(inout, op);
}

class Finished : public PendingCollective {
 public:
  explicit Finished(absl::Status status) : status_(std::move(status)) {}
  absl::Status Ready() override { return status_; }
  absl::Status Wait() override { return status_; }

 private:
  absl::Status status_;
};

}  // namespace

std::unique_ptr<PendingCollective> FinishedCollective(absl::Status status) {
  return std::make_unique<Finished>(std::move(status));
}

std::unique_ptr<PendingCollective> Communicator::DoStart(std::function<absl::Status()> run) {
  return FinishedCollective(run());
}

absl::StatusOr<std::unique_ptr<PendingCollective>> Communicator::Start(absl::string_view op, absl::Status valid,
                                                                       std::function<absl::Status()> run) {
  if (absl::Status s = Guard(); !s.ok()) return s;
  if (!valid.ok()) return valid;
  // A collective started behind one that failed must not touch the broken
  // backend when its turn comes.
  return DoStart([this, op, run = std::move(run)] {
    if (absl::Status s = Guard(); !s.ok()) return s;
    return Record(run(), op);
  });
}

absl::Status Communicator::AllGather(const TensorView& in, const TensorView& out) {
  if (absl::Status s = Guard(); !s.ok()) return s;
  if (absl::Status s = CheckAllGather(in, out, device_, size_); !s.ok()) return s;
  if (absl::Status s = Record(AfterStarted(), "all_gather"); !s.ok()) return s;
  return Record(DoAllGather(in, out), "all_gather");
}

absl::Status Communicator::ReduceScatter(const TensorView& in, const TensorView& out, ReduceOp op) {
  if (absl::Status s = Guard(); !s.ok()) return s;
  if (absl::Status s = CheckReduceScatter(in, out, op, device_, size_); !s.ok()) return s;
  if (absl::Status s = Record(AfterStarted(), "reduce_scatter"); !s.ok()) return s;
  return Record(DoReduceScatter(in, out, op), "reduce_scatter");
}

absl::Status Communicator::AllReduce(const TensorView& inout, ReduceOp op) {
  if (absl::Status s = Guard(); !s.ok()) return s;
  if (absl::Status s = CheckAllReduce(inout, op, device_); !s.ok()) return s;
  if (absl::Status s = Record(AfterStarted(), "all_reduce"); !s.ok()) return s;
  return Record(DoAllReduce(inout, op), "all_reduce");
}

absl::StatusOr<std::unique_ptr<PendingCollective>> Communicator::StartAllGather(const TensorView& in,
                                                                                const TensorView& out) {
  return Start("all_gather", CheckAllGather(in, out, device_, size_), [this, in, out] { return DoAllGather(in, out); });
}

absl::StatusOr<std::unique_ptr<PendingCollective>> Communicator::StartReduceScatter(const TensorView& in,
                                                                                    const TensorView& out,
                                                                                    ReduceOp op) {
  return Start("reduce_scatter", CheckReduceScatter(in, out, op, device_, size_),
               [this, in, out, op] { return DoReduceScatter(in, out, op); });
}

absl::StatusOr<std::unique_ptr<PendingCollective>> Communicator::StartAllReduce(const TensorView& inout, ReduceOp op) {
  return Start("all_reduce", CheckAllReduce(inout, op, device_), [this, inout, op] { return DoAllReduce(inout, op); });
}

absl::Status Communicator::AllToAll(const TensorView& in, absl::Span<const int64_t> send_counts,
                                    const TensorView& out, absl::Span<const int64_t> recv_counts) {
  if (absl::Status s = Guard(); !s.ok()) return s;
  if (absl::Status s = CheckBuffer(in, "all_to_all in", device_); !s.ok()) return s;
  if (absl::Status s = CheckBuffer(out, "all_to_all out", device_); !s.ok()) return s;
  if (absl::Status s = CheckSameDType(in, out); !s.ok()) return s;
  if (absl::Status s = CheckCounts(send_counts, size_, in.numel(), "all_to_all send_counts", "in"); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckCounts(recv_counts, size_, out.numel(), "all_to_all recv_counts", "out"); !s.ok()) {
    return s;
  }
  if (Overlap(in, out)) return absl::InvalidArgumentError("all_to_all: in and out overlap");
  if (absl::Status s = Record(AfterStarted(), "all_to_all"); !s.ok()) return s;
  return Record(DoAllToAll(in, send_counts, out, recv_counts), "all_to_all");
}

absl::Status Communicator::Broadcast(const TensorView& inout, int root) {
  if (absl::Status s = Guard(); !s.ok()) return s;
  if (absl::Status s = CheckBuffer(inout, "broadcast inout", device_); !s.ok()) return s;
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast: root ", root, " is not a rank in [0, ", size_, ")"));
  }
  if (absl::Status s = Record(AfterStarted(), "broadcast"); !s.ok()) return s;
  return Record(DoBroadcast(inout, root), "broadcast");
}

absl::Status Communicator::Barrier() {
  if (absl::Status s = Guard(); !s.ok()) return s;
  if (absl::Status s = Record(AfterStarted(), "barrier"); !s.ok()) return s;
  return Record(DoBarrier(), "barrier");
}

}  // namespace comm
}  // namespace recfleet
