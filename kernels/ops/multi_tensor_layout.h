#ifndef RECFLEET_KERNELS_OPS_MULTI_TENSOR_LAYOUT_H_
#define RECFLEET_KERNELS_OPS_MULTI_TENSOR_LAYOUT_H_

// The device table behind the multi-tensor optimizer kernels
// (multi_tensor.h): one entry per tensor with its pointers, its length and
// the first of the fixed-size chunks it is cut into; one CUDA block per
// chunk finds its entry by binary search. Plain C++ (no absl), included by
// the host code that packs the table and by the kernels that read it, so
// both use the same FindChunkOwner.

#include <cstdint>
#include <vector>

#ifdef __CUDACC__
#define RECFLEET_HOST_DEVICE __host__ __device__
#else
#define RECFLEET_HOST_DEVICE
#endif

namespace recfleet {

// Elements per chunk: one block's share. Large enough that the few dozen
// parameters of a model become a few thousand blocks of streaming work,
// small enough that the last chunk of a tensor wastes little of a block.
constexpr int64_t kMultiTensorChunk = 16384;

struct MultiTensorEntry {
  float* param = nullptr;
  float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  uint16_t* bf16 = nullptr;  // bf16 bits of a copy of param; null: none.
  int64_t numel = 0;
  int64_t first_chunk = 0;  // Set by AssignChunks.
};

// Drops the empty entries of `entries` (nothing to do for them, and an
// entry without chunks would confuse FindChunkOwner), numbers the chunks of
// the rest consecutively in order (first_chunk) and returns the total:
// the grid size of a launch over the table.
int64_t AssignChunks(std::vector<MultiTensorEntry>* entries, int64_t chunk = kMultiTensorChunk);

// The entry that holds chunk `chunk` of a table packed by AssignChunks:
// the last one whose first_chunk <= chunk. 0 <= chunk < the total.
RECFLEET_HOST_DEVICE inline int FindChunkOwner(const MultiTensorEntry* entries, int count,
                                               int64_t chunk) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (entries[mid].first_chunk <= chunk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_OPS_MULTI_TENSOR_LAYOUT_H_
