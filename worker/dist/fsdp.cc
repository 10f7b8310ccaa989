#include "worker/dist/fsdp.h"

#include "absl/strings/str_cat.h"

namespace recfleet {
namespace dist {

FlatShardLayout FlatShardLayout::Make(int64_t numel, int group_size) {
  FlatShardLayout l;
  l.numel = numel;
  l.shard_numel = (numel + group_size - 1) / group_size;
  l.padded_numel = l.shard_numel * group_size;
  return l;
}

absl::StatusOr<FsdpFlatParameter> FsdpFlatParameter::Create(int64_t numel, comm::Communicator* shard_group,
                                                            comm::Communicator* replica_group) {
  if (shard_group == nullptr) return absl::InvalidArgumentError("fsdp: shard_group is null");
  if (numel < 0) return absl::InvalidArgumentError(absl::StrCat("fsdp: numel ", numel, " < 0"));
  if (replica_group != nullptr && replica_group->device() != shard_group->device()) {
    return absl::InvalidArgumentError("fsdp: shard_group and replica_group live on different devices");
  }
  return FsdpFlatParameter(FlatShardLayout::Make(numel, shard_group->size()), shard_group, replica_group);
}

int FsdpFlatParameter::data_parallel_size() const {
  return shard_group_->size() * (replica_group_ != nullptr ? replica_group_->size() : 1);
}

absl::Status FsdpFlatParameter::AllGather(const TensorView& shard, const TensorView& full) const {
  if (absl::Status s = CheckDim(shard, "fsdp shard", 0, layout_.shard_numel); !s.ok()) return s;
  if (absl::Status s = CheckDim(full, "fsdp full parameter", 0, layout_.padded_numel); !s.ok()) return s;
  return shard_group_->AllGather(shard, full);
}

namespace {

// Averaging in both steps is the mean over all G x R ranks, since every
// group has the same size.
comm::ReduceOp OpOf(GradReduction reduction) {
  return reduction == GradReduction::kMean ? comm::ReduceOp::kAvg : comm::ReduceOp::kSum;
}

}  // namespace

absl::StatusOr<std::unique_ptr<comm::PendingCollective>> FsdpFlatParameter::StartAllGather(
    const TensorView& shard, const TensorView& full) const {
  if (absl::Status s = CheckDim(shard, "fsdp shard", 0, layout_.shard_numel); !s.ok()) return s;
  if (absl::Status s = CheckDim(full, "fsdp full parameter", 0, layout_.padded_numel); !s.ok()) return s;
  return shard_group_->StartAllGather(shard, full);
}

absl::StatusOr<std::unique_ptr<comm::PendingCollective>> FsdpFlatParameter::StartReduceScatter(
    const TensorView& full_grad, const TensorView& shard_grad, GradReduction reduction) const {
  if (absl::Status s = CheckDim(full_grad, "fsdp full gradient", 0, layout_.padded_numel); !s.ok()) return s;
  if (absl::Status s = CheckDim(shard_grad, "fsdp shard gradient", 0, layout_.shard_numel); !s.ok()) return s;
  return shard_group_->StartReduceScatter(full_grad, shard_grad, OpOf(reduction));
}

absl::StatusOr<std::unique_ptr<comm::PendingCollective>> FsdpFlatParameter::StartReplicaReduce(
    const TensorView& shard_grad, GradReduction reduction) const {
  if (absl::Status s = CheckDim(shard_grad, "fsdp shard gradient", 0, layout_.shard_numel); !s.ok()) return s;
  if (replica_group_ == nullptr || replica_group_->size() == 1) return comm::FinishedCollective(absl::OkStatus());
  return replica_group_->StartAllReduce(shard_grad, OpOf(reduction));
}

absl::Status FsdpFlatParameter::ReduceGradients(const TensorView& full_grad, const TensorView& shard_grad,
                                                GradReduction reduction) const {
  if (absl::Status s = CheckDim(full_grad, "fsdp full gradient", 0, layout_.padded_numel); !s.ok()) return s;
  if (absl::Status s = CheckDim(shard_grad, "fsdp shard gradient", 0, layout_.shard_numel); !s.ok()) return s;
  const comm::ReduceOp op = OpOf(reduction);
  if (absl::Status s = shard_group_->ReduceScatter(full_grad, shard_grad, op); !s.ok()) return s;
  if (replica_group_ == nullptr || replica_group_->size() == 1) return absl::OkStatus();
  return replica_group_->AllReduce(shard_grad, op);
}

}  // namespace dist
}  // namespace recfleet
