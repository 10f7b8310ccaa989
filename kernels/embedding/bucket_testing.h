#ifndef RECFLEET_KERNELS_EMBEDDING_BUCKET_TESTING_H_
#define RECFLEET_KERNELS_EMBEDDING_BUCKET_TESTING_H_

// Random sharded id batches for the bucketing tests, laid out the way a
// sharded embedding lays out its send buffer (by destination rank, then
// table, then bag), and the straightforward routing they must produce.

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/embedding/bucket.h"
#include "kernels/tensor.h"

namespace recfleet {

struct BucketCase {
  int group = 1;
  // Per table: the batch (offsets from 0) and its shards, one per holder
  // rank with rows (count slot rank * tables + table).
  std::vector<std::vector<int64_t>> ids, offsets;
  std::vector<std::vector<IdShard>> shards;
  int64_t num_lengths = 0;
  int64_t num_routed = 0;
  int64_t num_counts = 0;
};

struct BucketResult {
  std::vector<int64_t> lengths, routed, counts;
};

// `group` ranks, `tables` tables each table-wise, row-wise or column-wise
// at random over random ranks, row-wise tables sometimes with fewer rows
// than holders (holders without rows take no ids), bags empty or not, and
// sometimes no bags at all. `skewed`: every id in the first rows, so the
// other holders of a row-wise table receive nothing.
BucketCase RandomBucketCase(int group, int tables, bool skewed);

// For each rank, each table it holds, each bag: the bag's ids in the rank's
// rows, in order.
BucketResult ReferenceBucketing(const BucketCase& c);

// The case's tables with their ids and offsets placed by `place` (a view of
// the host vector on the device under test).
std::vector<IdBucketing> Bucketings(const BucketCase& c,
                                    const std::function<TensorView(const std::vector<int64_t>&)>& place);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_EMBEDDING_BUCKET_TESTING_H_
