#include "kernels/embedding/embedding_kernels.h"

#include <cub/cub.cuh>

#include "kernels/quant/cuda_util.h"

namespace recfleet::embedding_cuda {
namespace {

using cuda_util::LoadIndex;
using cuda_util::LoadVec;
using cuda_util::StoreVec;

constexpr int kWarpsPerBlock = 8;
// Rows gathered per step of a bag: enough independent 16-byte loads in
// flight per lane to cover HBM latency.
constexpr int kUnroll = 4;

__device__ __forceinline__ void BagBounds(const Lookup& l, int64_t bag, int64_t* begin,
                                          int64_t* end) {
  if (l.offsets == nullptr) {
    *begin = bag;
    *end = bag + 1;
  } else {
    *begin = LoadIndex(l.offsets, l.offsets64, bag);
    *end = LoadIndex(l.offsets, l.offsets64, bag + 1);
  }
}

// One warp per bag; each lane owns V consecutive columns of a 32*V-column
// chunk and accumulates in fp32.
template <typename TT, typename OT, int V>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    ForwardKernel(const TT* __restrict__ table, int64_t dim, Lookup l, OT* __restrict__ out) {
  const int lane = threadIdx.x & 31;
  const int64_t bag = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (bag >= l.bags) return;
  int64_t begin, end;
  BagBounds(l, bag, &begin, &end);
  const float scale = (l.mean && end > begin) ? 1.0f / static_cast<float>(end - begin) : 1.0f;
  for (int64_t d0 = static_cast<int64_t>(lane) * V; d0 < dim; d0 += 32 * V) {
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.0f;
    int64_t i = begin;
    for (; i + kUnroll <= end; i += kUnroll) {
      float v[kUnroll][V];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t row = LoadIndex(l.ids, l.ids64, i + u);
        LoadVec<TT, V>(table + row * dim + d0, v[u]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] += v[u][j];
      }
    }
    for (; i < end; ++i) {
      float v[V];
      LoadVec<TT, V>(table + LoadIndex(l.ids, l.ids64, i) * dim + d0, v);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += v[j];
    }
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] *= scale;
    StoreVec<OT, V>(out + bag * dim + d0, acc);
  }
}

// Writes the sort input: key = id (as int64), value = position, and the bag
// of every position (pooled lookups).
__global__ void PrepareKernel(Lookup l, long long* __restrict__ keys, int* __restrict__ positions,
                              int* __restrict__ pos_bag) {
  const int64_t bag = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (bag >= l.bags) return;
  int64_t begin, end;
  BagBounds(l, bag, &begin, &end);
  for (int64_t i = begin; i < end; ++i) {
    keys[i] = LoadIndex(l.ids, l.ids64, i);
    positions[i] = static_cast<int>(i);
    if (pos_bag != nullptr) pos_bag[i] = static_cast<int>(bag);
  }
}

// Adds this lane's V columns (at d0) of the gradient of one distinct id:
// the sum over its occurrences of the (mean-scaled) output-gradient rows.
template <typename GT, int V>
__device__ __forceinline__ void GatherGrad(const GT* __restrict__ grad, int64_t dim, int64_t d0,
                                           const Lookup& l, const int* __restrict__ positions,
                                           const int* __restrict__ pos_bag, int64_t start,
                                           int64_t count, float (&g)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) g[j] = 0.0f;
  for (int64_t p = start; p < start + count; ++p) {
    const int pos = __ldg(positions + p);
    int64_t bag = pos;
    float scale = 1.0f;
    if (pos_bag != nullptr) {
      bag = __ldg(pos_bag + pos);
      if (l.mean) {
        int64_t b0, b1;
        BagBounds(l, bag, &b0, &b1);
        scale = 1.0f / static_cast<float>(b1 - b0);
      }
    }
    float v[V];
    LoadVec<GT, V>(grad + bag * dim + d0, v);
#pragma unroll
    for (int j = 0; j < V; ++j) g[j] += scale * v[j];
  }
}

// One warp per distinct id: gather its gradient, then one rowwise Adagrad
// step on its table row and momentum. kSingle: the row fits one 32*V chunk,
// so the gradient stays in registers; otherwise it is gathered twice (once
// for the squared norm, once for the update).
template <typename TT, typename GT, int V, bool kSingle>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    AdagradKernel(TT* __restrict__ table, int64_t dim, const GT* __restrict__ grad, Lookup l,
                  const long long* __restrict__ unique_ids, const int* __restrict__ run_counts,
                  const int* __restrict__ run_starts, const int* __restrict__ num_runs,
                  const int* __restrict__ positions, const int* __restrict__ pos_bag, float lr,
                  float eps, float* __restrict__ momentum) {
  const int lane = threadIdx.x & 31;
  const int64_t run = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (run >= *num_runs) return;
  const int64_t id = unique_ids[run];
  const int64_t start = run_starts[run], count = run_counts[run];
  TT* row = table + id * dim;
  if constexpr (kSingle) {
    const int64_t d0 = static_cast<int64_t>(lane) * V;
    float g[V];
    float sq = 0.0f;
    if (d0 < dim) {
      GatherGrad<GT, V>(grad, dim, d0, l, positions, pos_bag, start, count, g);
#pragma unroll
      for (int j = 0; j < V; ++j) sq += g[j] * g[j];
    }
    const float m = momentum[id] + cuda_util::WarpSum(sq) / static_cast<float>(dim);
    const float step = lr / (sqrtf(m) + eps);
    if (lane == 0) momentum[id] = m;
    if (d0 < dim) {
      float w[V];
      LoadVec<TT, V>(row + d0, w);
#pragma unroll
      for (int j = 0; j < V; ++j) w[j] -= step * g[j];
      StoreVec<TT, V>(row + d0, w);
    }
  } else {
    float sq = 0.0f;
    for (int64_t d0 = static_cast<int64_t>(lane) * V; d0 < dim; d0 += 32 * V) {
      float g[V];
      GatherGrad<GT, V>(grad, dim, d0, l, positions, pos_bag, start, count, g);
#pragma unroll
      for (int j = 0; j < V; ++j) sq += g[j] * g[j];
    }
    const float m = momentum[id] + cuda_util::WarpSum(sq) / static_cast<float>(dim);
    const float step = lr / (sqrtf(m) + eps);
    if (lane == 0) momentum[id] = m;
    for (int64_t d0 = static_cast<int64_t>(lane) * V; d0 < dim; d0 += 32 * V) {
      float g[V], w[V];
      GatherGrad<GT, V>(grad, dim, d0, l, positions, pos_bag, start, count, g);
      LoadVec<TT, V>(row + d0, w);
#pragma unroll
      for (int j = 0; j < V; ++j) w[j] -= step * g[j];
      StoreVec<TT, V>(row + d0, w);
    }
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename TT, typename OT>
cudaError_t LaunchForward(const Table& t, const Lookup& l, void* out, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(TT);
  const unsigned grid = cuda_util::GridFor(l.bags, kWarpsPerBlock);
  if (l.bags == 0) return cudaSuccess;
  if (t.dim % kVec == 0 && Aligned16(t.data)) {
    ForwardKernel<TT, OT, kVec><<<grid, kWarpsPerBlock * 32, 0, s>>>(
        static_cast<const TT*>(t.data), t.dim, l, static_cast<OT*>(out));
  } else {
    ForwardKernel<TT, OT, 1><<<grid, kWarpsPerBlock * 32, 0, s>>>(
        static_cast<const TT*>(t.data), t.dim, l, static_cast<OT*>(out));
  }
  return cudaGetLastError();
}

template <typename TT, typename GT>
void LaunchAdagrad(const Table& t, const Lookup& l, const void* grad, const long long* unique_ids,
                   const int* counts, const int* starts, const int* num_runs,
                   const int* positions, const int* pos_bag, float lr, float eps,
                   float* momentum, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(TT);
  const unsigned grid = cuda_util::GridFor(l.num_ids, kWarpsPerBlock);
  TT* table = static_cast<TT*>(t.data);
  const GT* g = static_cast<const GT*>(grad);
  const bool vec = t.dim % kVec == 0 && Aligned16(t.data) && Aligned16(grad);
  const int64_t chunk = 32 * (vec ? kVec : 1);
#define RECFLEET_ADAGRAD(V, SINGLE)                                                          \
  AdagradKernel<TT, GT, V, SINGLE><<<grid, kWarpsPerBlock * 32, 0, s>>>(                     \
      table, t.dim, g, l, unique_ids, counts, starts, num_runs, positions, pos_bag, lr, eps, \
      momentum)
  if (vec) {
    if (t.dim <= chunk) {
      RECFLEET_ADAGRAD(kVec, true);
    } else {
      RECFLEET_ADAGRAD(kVec, false);
    }
  } else if (t.dim <= chunk) {
    RECFLEET_ADAGRAD(1, true);
  } else {
    RECFLEET_ADAGRAD(1, false);
  }
#undef RECFLEET_ADAGRAD
}

// Carves consecutive 256-byte aligned pieces out of one allocation.
struct Arena {
  char* base = nullptr;
  size_t used = 0;
  template <typename T>
  T* Take(size_t count) {
    T* p = reinterpret_cast<T*>(base + used);
    used += (count * sizeof(T) + 255) / 256 * 256;
    return p;
  }
};

int KeyBits(int64_t rows) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) < rows) ++bits;
  return bits;
}

}  // namespace

cudaError_t Forward(const Table& table, const Lookup& lookup, void* out, bool out_bf16,
                    void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (table.bf16) {
    return out_bf16 ? LaunchForward<__nv_bfloat16, __nv_bfloat16>(table, lookup, out, s)
                    : LaunchForward<__nv_bfloat16, float>(table, lookup, out, s);
  }
  return out_bf16 ? LaunchForward<float, __nv_bfloat16>(table, lookup, out, s)
                  : LaunchForward<float, float>(table, lookup, out, s);
}

cudaError_t BackwardAdagrad(const Table& table, const Lookup& lookup, const void* grad,
                            bool grad_bf16, float learning_rate, float eps, float* momentum,
                            void* stream) {
  const int64_t n = lookup.num_ids;
  if (n == 0) return cudaSuccess;
  if (n > INT32_MAX) return cudaErrorInvalidValue;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int bits = KeyBits(table.rows);
  const bool pooled = lookup.offsets != nullptr;

  // Temporary storage: sized in a dry run of the arena (null base), then
  // allocated once.
  size_t sort_bytes = 0, rle_bytes = 0, scan_bytes = 0;
  cudaError_t err = cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const long long*>(nullptr), static_cast<long long*>(nullptr),
      static_cast<const int*>(nullptr), static_cast<int*>(nullptr), static_cast<int>(n), 0, bits, s);
  if (err != cudaSuccess) return err;
  err = cub::DeviceRunLengthEncode::Encode(nullptr, rle_bytes, static_cast<const long long*>(nullptr),
                                           static_cast<long long*>(nullptr),
                                           static_cast<int*>(nullptr), static_cast<int*>(nullptr),
                                           static_cast<int>(n), s);
  if (err != cudaSuccess) return err;
  err = cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<const int*>(nullptr),
                                      static_cast<int*>(nullptr), static_cast<int>(n), s);
  if (err != cudaSuccess) return err;
  auto layout = [&](Arena& a, long long** keys, long long** sorted_keys, int** pos,
                    int** sorted_pos, int** pos_bag, long long** unique_ids, int** counts,
                    int** starts, int** num_runs, void** temp) {
    *keys = a.Take<long long>(n);
    *sorted_keys = a.Take<long long>(n);
    *pos = a.Take<int>(n);
    *sorted_pos = a.Take<int>(n);
    *pos_bag = pooled ? a.Take<int>(n) : nullptr;
    *unique_ids = a.Take<long long>(n);
    *counts = a.Take<int>(n);
    *starts = a.Take<int>(n);
    *num_runs = a.Take<int>(1);
    *temp = a.Take<char>(std::max(sort_bytes, std::max(rle_bytes, scan_bytes)));
  };
  long long *keys, *sorted_keys, *unique_ids;
  int *pos, *sorted_pos, *pos_bag, *counts, *starts, *num_runs;
  void* temp;
  Arena sizing;
  layout(sizing, &keys, &sorted_keys, &pos, &sorted_pos, &pos_bag, &unique_ids, &counts, &starts,
         &num_runs, &temp);
  Arena arena;
  err = cudaMallocAsync(reinterpret_cast<void**>(&arena.base), sizing.used, s);
  if (err != cudaSuccess) return err;
  layout(arena, &keys, &sorted_keys, &pos, &sorted_pos, &pos_bag, &unique_ids, &counts, &starts,
         &num_runs, &temp);

  const int64_t bags = pooled ? lookup.bags : n;
  Lookup prep = lookup;
  prep.bags = bags;
  PrepareKernel<<<cuda_util::GridFor(bags, 256), 256, 0, s>>>(prep, keys, pos, pos_bag);
  err = cudaGetLastError();
  if (err == cudaSuccess) {
    err = cub::DeviceRadixSort::SortPairs(temp, sort_bytes, keys, sorted_keys, pos, sorted_pos,
                                          static_cast<int>(n), 0, bits, s);
  }
  if (err == cudaSuccess) {
    err = cub::DeviceRunLengthEncode::Encode(temp, rle_bytes, sorted_keys, unique_ids, counts,
                                             num_runs, static_cast<int>(n), s);
  }
  if (err == cudaSuccess) {
    err = cub::DeviceScan::ExclusiveSum(temp, scan_bytes, counts, starts, static_cast<int>(n), s);
  }
  if (err == cudaSuccess) {
    if (table.bf16) {
      if (grad_bf16) {
        LaunchAdagrad<__nv_bfloat16, __nv_bfloat16>(table, lookup, grad, unique_ids, counts,
                                                     starts, num_runs, sorted_pos, pos_bag,
                                                     learning_rate, eps, momentum, s);
      } else {
        LaunchAdagrad<__nv_bfloat16, float>(table, lookup, grad, unique_ids, counts, starts,
                                            num_runs, sorted_pos, pos_bag, learning_rate, eps,
                                            momentum, s);
      }
    } else if (grad_bf16) {
      LaunchAdagrad<float, __nv_bfloat16>(table, lookup, grad, unique_ids, counts, starts,
                                          num_runs, sorted_pos, pos_bag, learning_rate, eps,
                                          momentum, s);
    } else {
      LaunchAdagrad<float, float>(table, lookup, grad, unique_ids, counts, starts, num_runs,
                                  sorted_pos, pos_bag, learning_rate, eps, momentum, s);
    }
    err = cudaGetLastError();
  }
  const cudaError_t free_err = cudaFreeAsync(arena.base, s);
  return err != cudaSuccess ? err : free_err;
}

}  // namespace recfleet::embedding_cuda
