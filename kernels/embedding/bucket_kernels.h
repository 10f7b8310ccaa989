#ifndef RECFLEET_KERNELS_EMBEDDING_BUCKET_KERNELS_H_
#define RECFLEET_KERNELS_EMBEDDING_BUCKET_KERNELS_H_

// CUDA kernels behind bucket.h, with a plain interface (no absl) so that
// only this pair of files goes through nvcc. Pointers are device pointers;
// launches go to `stream` (a cudaStream_t).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace recfleet::bucket_cuda {

// Shards per launch: their ranges travel in the kernel's parameters (no
// per-step copy of them to the device); a table of more shards takes
// several launches.
constexpr int kMaxShards = 32;

struct Shard {
  int64_t first, end, lengths_at, count_slot;
};

// Up to kMaxShards shards of one table.
struct Launch {
  const int64_t* ids = nullptr;
  const int64_t* offsets = nullptr;  // [bags + 1]
  int64_t bags = 0;
  int num_shards = 0;
  Shard shards[kMaxShards];
};

// bucket.h's BucketIdsByShard over `launches` (host array), lengths [L],
// counts [C] (zeroed here), routed [sum of lengths].
cudaError_t Bucket(const Launch* launches, int num_launches, int64_t* lengths, int64_t num_lengths,
                   int64_t* routed, int64_t* counts, int64_t num_counts, void* stream);

// offsets [n + 1] = 0 then the running sum of lengths [n].
cudaError_t OffsetsFromLengths(const int64_t* lengths, int64_t n, int64_t* offsets, void* stream);

}  // namespace recfleet::bucket_cuda

#endif  // RECFLEET_KERNELS_EMBEDDING_BUCKET_KERNELS_H_
