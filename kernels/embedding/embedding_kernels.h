#ifndef RECFLEET_KERNELS_EMBEDDING_EMBEDDING_KERNELS_H_
#define RECFLEET_KERNELS_EMBEDDING_EMBEDDING_KERNELS_H_

// CUDA kernels behind embedding.h, with a plain interface (no absl) so that
// only this pair of files goes through nvcc. Pointers are device pointers;
// launches go to `stream` (a cudaStream_t).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace recfleet::embedding_cuda {

struct Lookup {
  const void* ids = nullptr;
  bool ids64 = false;
  const void* offsets = nullptr;  // null: every id is its own bag
  bool offsets64 = false;
  int64_t num_ids = 0;
  int64_t bags = 0;
  bool mean = false;
};

struct Table {
  void* data = nullptr;
  bool bf16 = false;  // else fp32
  int64_t rows = 0, dim = 0;
};

// out[b] = sum (or mean) of table rows of bag b; out is [bags, dim].
cudaError_t Forward(const Table& table, const Lookup& lookup, void* out, bool out_bf16,
                    void* stream);

// Dedup + rowwise Adagrad: sorts (id, bag) pairs by id (32-bit keys when
// the table has at most 2^32 rows; by id >> 1 or id >> 2 where that saves a
// radix pass); the lane group at the first occurrence of each id sums that
// id's gradient rows and updates its table row and momentum. Temporaries
// come from cudaMallocAsync on `stream`.
cudaError_t BackwardAdagrad(const Table& table, const Lookup& lookup, const void* grad,
                            bool grad_bf16, float learning_rate, float eps, float* momentum,
                            void* stream);

}  // namespace recfleet::embedding_cuda

#endif  // RECFLEET_KERNELS_EMBEDDING_EMBEDDING_KERNELS_H_
