#ifndef RECFLEET_KERNELS_EMBEDDING_BUCKET_H_
#define RECFLEET_KERNELS_EMBEDDING_BUCKET_H_

// Routing of embedding ids to the shards that hold their rows, done where
// the ids are (host or GPU), so that a sharded lookup never brings them back
// to the host to sort them: per shard and bag, how many of the bag's ids the
// shard holds; an exclusive scan of those counts; a stable scatter of the
// ids (as the shard's local rows) into one send buffer laid out in the
// order of the counts. The counts double as the bag lengths of the routed
// batch, so a receiver rebuilds its jagged offsets from them alone.
//
// Devices: every tensor of one call lives on one Device and the call
// dispatches on it. kCpu checks everything (including that every entry of
// `lengths` is written exactly once and that `routed` holds exactly the
// routed ids). kCuda checks shapes, dtypes and the layout on the host but
// not the ids: ids outside every shard's range are simply not routed, and
// `routed` must have room for them all (the caller knows the total: every
// id lands in exactly one shard of a row-partitioned table, in every shard
// of a replicated one). CUDA work goes to `stream` (a cudaStream_t; nullptr
// = the legacy default stream), asynchronously; its scan temporaries come
// from cudaMallocAsync on that stream. Each shard reads every id of its
// table once (one thread per shard and bag), which suits table groups of
// tens of ranks and bags of up to hundreds of ids.
//
// Thread-safety: reentrant.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/tensor.h"

namespace recfleet {

// One destination of a table's ids.
struct IdShard {
  // Ids in [first, end) go to this shard, as id - first.
  int64_t first = 0;
  int64_t end = 0;
  // Where its per-bag counts start in `lengths` (one per bag).
  int64_t lengths_at = 0;
  // The entry of `counts` that sums them (several shards may share one).
  int64_t count_slot = 0;
};

// One table's batch and where its ids go. Row-wise sharding: shards with
// disjoint row ranges; table-wise: one shard [0, rows); column-wise: every
// slice holder a shard [0, rows), so each gets every id.
struct IdBucketing {
  JaggedView ids;  // values int64 [n], offsets int64 [bags + 1] from 0.
  std::vector<IdShard> shards;
};

// For every table, shard s and bag b:
//   lengths[s.lengths_at + b] = the number of ids of bag b in [s.first, s.end);
//   counts[s.count_slot]     += that number (counts is zeroed first);
// and `routed` holds, for the entries of `lengths` in index order, each
// one's ids as id - s.first in bag order (a stable scatter). lengths [L]
// int64, each entry written by exactly one (shard, bag); routed [sum of
// lengths] int64; counts [C] int64.
absl::Status BucketIdsByShard(absl::Span<const IdBucketing> tables, const TensorView& lengths,
                              const TensorView& routed, const TensorView& counts,
                              void* stream = nullptr);

// offsets[0] = 0, offsets[i + 1] = offsets[i] + lengths[i]: the jagged
// offsets of bags with these lengths. lengths [n] int64, offsets [n + 1]
// int64, one device.
absl::Status OffsetsFromLengths(const TensorView& lengths, const TensorView& offsets,
                                void* stream = nullptr);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_EMBEDDING_BUCKET_H_
