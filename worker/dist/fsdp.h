#ifndef RECFLEET_WORKER_DIST_FSDP_H_
#define RECFLEET_WORKER_DIST_FSDP_H_

// 2D FSDP for one flat parameter buffer (all dense parameters of a module,
// concatenated): each rank of an FSDP group of G ranks keeps one shard of
// the parameter and of its optimizer state; the full parameter is
// all-gathered before use; gradients are reduce-scattered inside the group
// and the shard gradients all-reduced across the replica group (the ranks
// holding the same shard in the other FSDP groups). The optimizer then steps
// the shard only, and every replica's shard stays identical.
//
// The buffer is padded to a multiple of G so every shard has the same size;
// padding sits at the tail of the last shards, and stays zero as long as its
// gradient is zero (which ReduceGradients guarantees when the caller's full
// gradient is zero there).
//
// Model-independent: callers own every buffer (host or device, matching the
// communicators' device) and pass views. Not thread-safe (the communicators
// are not).

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"
#include "worker/comm/communicator.h"

namespace recfleet {
namespace dist {

struct FlatShardLayout {
  int64_t numel = 0;         // Elements of the parameter.
  int64_t padded_numel = 0;  // numel rounded up to a multiple of the group size.
  int64_t shard_numel = 0;   // padded_numel / group size.

  static FlatShardLayout Make(int64_t numel, int group_size);
  // First element of group rank r's shard in the padded buffer.
  int64_t ShardOffset(int r) const { return r * shard_numel; }
};

enum class GradReduction {
  kSum,   // Shard gradient = sum over every data-parallel rank.
  kMean,  // ... divided by the number of data-parallel ranks (G x replicas).
};

class FsdpFlatParameter {
 public:
  // `shard_group` is the FSDP group; `replica_group` the ranks holding the
  // same shard in other replicas (nullptr: no replicas). Neither is owned;
  // both must outlive this object.
  static absl::StatusOr<FsdpFlatParameter> Create(int64_t numel, comm::Communicator* shard_group,
                                                  comm::Communicator* replica_group);

  const FlatShardLayout& layout() const { return layout_; }
  // Ranks that hold a copy of each shard, times the group size.
  int data_parallel_size() const;

  // full [padded_numel] = every group rank's `shard` [shard_numel], in order.
  absl::Status AllGather(const TensorView& shard, const TensorView& full) const;

  // `full_grad` [padded_numel] is this rank's gradient of the full
  // parameter (it is left unchanged); `shard_grad` [shard_numel] receives
  // this rank's shard of the gradient reduced over every data-parallel rank.
  absl::Status ReduceGradients(const TensorView& full_grad, const TensorView& shard_grad,
                               GradReduction reduction) const;

  // The same in started form (comm::Communicator::Start*), for overlapping
  // them with computation: StartAllGather is AllGather; ReduceGradients is
  // StartReduceScatter, then, once that is ready, StartReplicaReduce (a
  // finished handle without replicas). The communicators run them in the
  // order they are started, behind the blocking calls issued before.
  absl::StatusOr<std::unique_ptr<comm::PendingCollective>> StartAllGather(const TensorView& shard,
                                                                          const TensorView& full) const;
  absl::StatusOr<std::unique_ptr<comm::PendingCollective>> StartReduceScatter(const TensorView& full_grad,
                                                                              const TensorView& shard_grad,
                                                                              GradReduction reduction) const;
  absl::StatusOr<std::unique_ptr<comm::PendingCollective>> StartReplicaReduce(const TensorView& shard_grad,
                                                                              GradReduction reduction) const;

 private:
  FsdpFlatParameter(FlatShardLayout layout, comm::Communicator* shard_group, comm::Communicator* replica_group)
      : layout_(layout), shard_group_(shard_group), replica_group_(replica_group) {}

  FlatShardLayout layout_;
  comm::Communicator* shard_group_;
  comm::Communicator* replica_group_;
};

}  // namespace dist
}  // namespace recfleet

#endif  // RECFLEET_WORKER_DIST_FSDP_H_
