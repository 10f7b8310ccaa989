#include "kernels/embedding/bucket_kernels.h"

#include <cub/cub.cuh>

#include "kernels/base/cuda_util.h"

namespace recfleet::bucket_cuda {
namespace {

constexpr int kThreads = 256;

// One thread per (shard, bag): the bag's ids in the shard's range, counted
// into lengths and, summed per warp, into the shard's count slot (integer
// atomics: the sum does not depend on their order).
__global__ void __launch_bounds__(kThreads) CountKernel(Launch l, int64_t* __restrict__ lengths,
                                                        unsigned long long* __restrict__ counts) {
  const Shard& s = l.shards[blockIdx.y];
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  long long c = 0;
  if (b < l.bags) {
    const int64_t end = __ldg(l.offsets + b + 1);
    for (int64_t i = __ldg(l.offsets + b); i < end; ++i) {
      const int64_t id = __ldg(l.ids + i);
      c += id >= s.first && id < s.end;
    }
    lengths[s.lengths_at + b] = c;
  }
  for (int o = 16; o > 0; o >>= 1) c += __shfl_down_sync(0xffffffffu, c, o);
  if ((threadIdx.x & 31) == 0 && c != 0) atomicAdd(counts + s.count_slot, static_cast<unsigned long long>(c));
}

// One thread per (shard, bag): the bag's ids in range, in bag order, from
// the bag's place in the send buffer (the scan of lengths) on.
__global__ void __launch_bounds__(kThreads) ScatterKernel(Launch l, const int64_t* __restrict__ starts,
                                                          int64_t* __restrict__ routed) {
  const Shard& s = l.shards[blockIdx.y];
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (b >= l.bags) return;
  int64_t at = __ldg(starts + s.lengths_at + b);
  const int64_t end = __ldg(l.offsets + b + 1);
  for (int64_t i = __ldg(l.offsets + b); i < end; ++i) {
    const int64_t id = __ldg(l.ids + i);
    if (id >= s.first && id < s.end) routed[at++] = id - s.first;
  }
}

dim3 GridOf(const Launch& l) { return dim3(cuda_util::GridFor(l.bags, kThreads), l.num_shards); }

}  // namespace

cudaError_t Bucket(const Launch* launches, int num_launches, int64_t* lengths, int64_t num_lengths,
                   int64_t* routed, int64_t* counts, int64_t num_counts, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (num_counts > 0) {
    cudaError_t err = cudaMemsetAsync(counts, 0, num_counts * sizeof(int64_t), st);
    if (err != cudaSuccess) return err;
  }
  for (int i = 0; i < num_launches; ++i) {
    if (launches[i].bags == 0 || launches[i].num_shards == 0) continue;
    CountKernel<<<GridOf(launches[i]), kThreads, 0, st>>>(launches[i], lengths,
                                                          reinterpret_cast<unsigned long long*>(counts));
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (num_lengths == 0) return cudaSuccess;
  // Where each (shard, bag) run starts in `routed`: the exclusive scan of
  // lengths, since `routed` follows the order of `lengths`.
  size_t scan_bytes = 0;
  cudaError_t err = cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, lengths, lengths,
                                                  static_cast<int>(num_lengths), st);
  if (err != cudaSuccess) return err;
  const size_t starts_bytes = (num_lengths * sizeof(int64_t) + 255) / 256 * 256;
  char* scratch = nullptr;
  err = cudaMallocAsync(reinterpret_cast<void**>(&scratch), starts_bytes + scan_bytes, st);
  if (err != cudaSuccess) return err;
  int64_t* starts = reinterpret_cast<int64_t*>(scratch);
  err = cub::DeviceScan::ExclusiveSum(scratch + starts_bytes, scan_bytes, lengths, starts,
                                      static_cast<int>(num_lengths), st);
  for (int i = 0; i < num_launches && err == cudaSuccess; ++i) {
    if (launches[i].bags == 0 || launches[i].num_shards == 0) continue;
    ScatterKernel<<<GridOf(launches[i]), kThreads, 0, st>>>(launches[i], starts, routed);
    err = cudaGetLastError();
  }
  const cudaError_t free_err = cudaFreeAsync(scratch, st);
  return err != cudaSuccess ? err : free_err;
}

cudaError_t OffsetsFromLengths(const int64_t* lengths, int64_t n, int64_t* offsets, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaMemsetAsync(offsets, 0, sizeof(int64_t), st);
  if (err != cudaSuccess || n == 0) return err;
  size_t scan_bytes = 0;
  err = cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, lengths, offsets + 1, static_cast<int>(n), st);
  if (err != cudaSuccess) return err;
  void* temp = nullptr;
  err = cudaMallocAsync(&temp, scan_bytes, st);
  if (err != cudaSuccess) return err;
  err = cub::DeviceScan::InclusiveSum(temp, scan_bytes, lengths, offsets + 1, static_cast<int>(n), st);
  const cudaError_t free_err = cudaFreeAsync(temp, st);
  return err != cudaSuccess ? err : free_err;
}

}  // namespace recfleet::bucket_cuda
