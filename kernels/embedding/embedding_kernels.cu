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

// A group of G lanes (a power of two, G * V >= the row where possible) per
// bag, so short rows (bf16 x 128 = 256 B) still keep every lane busy. Each
// lane owns V consecutive columns of a G*V-column chunk and accumulates in
// fp32.
template <typename TT, typename OT, int V>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    ForwardKernel(const TT* __restrict__ table, int64_t dim, Lookup l, OT* __restrict__ out,
                  int group) {
  const int lane = threadIdx.x & 31;
  const int sub = lane & (group - 1);
  const int64_t bag = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5)) *
                          (32 / group) + lane / group;
  if (bag >= l.bags) return;
  int64_t begin, end;
  BagBounds(l, bag, &begin, &end);
  const float scale = (l.mean && end > begin) ? 1.0f / static_cast<float>(end - begin) : 1.0f;
  for (int64_t d0 = static_cast<int64_t>(sub) * V; d0 < dim; d0 += group * V) {
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

// Writes the sort input: key = id (as int64), value = the bag (output row)
// the id contributes to. One warp per bag, so writes coalesce.
__global__ void PrepareKernel(Lookup l, long long* __restrict__ keys, int* __restrict__ bag_of) {
  const int lane = threadIdx.x & 31;
  const int64_t bag = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (bag >= l.bags) return;
  int64_t begin, end;
  BagBounds(l, bag, &begin, &end);
  for (int64_t i = begin + lane; i < end; i += 32) {
    keys[i] = LoadIndex(l.ids, l.ids64, i);
    bag_of[i] = static_cast<int>(bag);
  }
}

// Adds this lane's C chunks of V columns (chunk c at column d0 + c*stride)
// of the gradient of one distinct id: the sum over its occurrences of the
// (mean-scaled) output-gradient rows.
template <typename GT, int V, int C>
__device__ __forceinline__ void GatherGrad(const GT* __restrict__ grad, int64_t dim, int64_t d0,
                                           int64_t stride, const Lookup& l,
                                           const int* __restrict__ bag_of, int64_t start,
                                           int64_t count, float (&g)[C][V]) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
#pragma unroll
    for (int j = 0; j < V; ++j) g[c][j] = 0.0f;
  }
  for (int64_t p = start; p < start + count; ++p) {
    const int64_t bag = __ldg(bag_of + p);
    float scale = 1.0f;
    if (l.mean) {
      int64_t b0, b1;
      BagBounds(l, bag, &b0, &b1);
      scale = 1.0f / static_cast<float>(b1 - b0);
    }
    float v[C][V];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (d0 + c * stride < dim) LoadVec<GT, V>(grad + bag * dim + d0 + c * stride, v[c]);
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (d0 + c * stride < dim) {
#pragma unroll
        for (int j = 0; j < V; ++j) g[c][j] += scale * v[c][j];
      }
    }
  }
}

// Sum over the `group` lanes of one run (xor offsets stay inside a group).
__device__ __forceinline__ float GroupSum(float v, int group) {
  for (int o = group >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A group of lanes per distinct id: gather its gradient, then one rowwise
// Adagrad step on its table row and momentum. Each lane holds C chunks of V
// columns, so a warp serves several ids with several independent loads per
// lane in flight; the table row and momentum are loaded before the gradient
// gather so the two memory chains overlap. C == 0: rows longer than a
// group's registers; the gradient is gathered twice (squared norm, then
// update), one chunk at a time.
template <typename TT, typename GT, int V, int C>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    AdagradKernel(TT* __restrict__ table, int64_t dim, const GT* __restrict__ grad, Lookup l,
                  const long long* __restrict__ unique_ids, const int* __restrict__ run_counts,
                  const int* __restrict__ run_starts, const int* __restrict__ num_runs,
                  const int* __restrict__ bag_of, float lr, float eps,
                  float* __restrict__ momentum, int group) {
  const int lane = threadIdx.x & 31;
  const int sub = lane & (group - 1);
  const int64_t runs = *num_runs;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5)) *
                        (32 / group);
  if (first >= runs) return;  // whole warp: the shuffles below need every lane
  const int64_t run = first + lane / group;
  const bool active = run < runs;
  const int64_t id = active ? unique_ids[run] : 0;
  const int64_t start = active ? run_starts[run] : 0, count = active ? run_counts[run] : 0;
  TT* row = table + id * dim;
  const float m0 = active ? momentum[id] : 0.0f;
  const int64_t d0 = static_cast<int64_t>(sub) * V, stride = static_cast<int64_t>(group) * V;
  if constexpr (C > 0) {
    float w[C][V], g[C][V];
    float sq = 0.0f;
    if (active) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (d0 + c * stride < dim) LoadVec<TT, V>(row + d0 + c * stride, w[c]);
      }
      GatherGrad<GT, V, C>(grad, dim, d0, stride, l, bag_of, start, count, g);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (d0 + c * stride < dim) {
#pragma unroll
          for (int j = 0; j < V; ++j) sq += g[c][j] * g[c][j];
        }
      }
    }
    const float m = m0 + GroupSum(sq, group) / static_cast<float>(dim);
    const float step = lr / (sqrtf(m) + eps);
    if (active && sub == 0) momentum[id] = m;
    if (active) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (d0 + c * stride < dim) {
#pragma unroll
          for (int j = 0; j < V; ++j) w[c][j] -= step * g[c][j];
          StoreVec<TT, V>(row + d0 + c * stride, w[c]);
        }
      }
    }
  } else {
    float sq = 0.0f;
    for (int64_t d = d0; active && d < dim; d += stride) {
      float g[1][V];
      GatherGrad<GT, V, 1>(grad, dim, d, stride, l, bag_of, start, count, g);
#pragma unroll
      for (int j = 0; j < V; ++j) sq += g[0][j] * g[0][j];
    }
    const float m = m0 + GroupSum(sq, group) / static_cast<float>(dim);
    const float step = lr / (sqrtf(m) + eps);
    if (active && sub == 0) momentum[id] = m;
    for (int64_t d = d0; active && d < dim; d += stride) {
      float g[1][V], w[V];
      LoadVec<TT, V>(row + d, w);
      GatherGrad<GT, V, 1>(grad, dim, d, stride, l, bag_of, start, count, g);
#pragma unroll
      for (int j = 0; j < V; ++j) w[j] -= step * g[0][j];
      StoreVec<TT, V>(row + d, w);
    }
  }
}

// Lanes per row: the smallest power of two covering dim / V, capped at 32.
int GroupFor(int64_t dim, int v) {
  int g = 1;
  while (g < 32 && static_cast<int64_t>(g) * v < dim) g <<= 1;
  return g;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename TT, typename OT>
cudaError_t LaunchForward(const Table& t, const Lookup& l, void* out, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(TT);
  if (l.bags == 0) return cudaSuccess;
  const bool vec = t.dim % kVec == 0 && Aligned16(t.data);
  const int group = GroupFor(t.dim, vec ? kVec : 1);
  const unsigned grid = cuda_util::GridFor(l.bags, kWarpsPerBlock * (32 / group));
  if (vec) {
    ForwardKernel<TT, OT, kVec><<<grid, kWarpsPerBlock * 32, 0, s>>>(
        static_cast<const TT*>(t.data), t.dim, l, static_cast<OT*>(out), group);
  } else {
    ForwardKernel<TT, OT, 1><<<grid, kWarpsPerBlock * 32, 0, s>>>(
        static_cast<const TT*>(t.data), t.dim, l, static_cast<OT*>(out), group);
  }
  return cudaGetLastError();
}

// Chunks per lane C and lanes per id: up to 4 chunks of V columns per lane
// (more loads in flight, more ids per warp) but at least 8 lanes per id;
// rows beyond 32 lanes x 4 chunks take the two-pass kernel (C = 0).
template <typename TT, typename GT>
void LaunchAdagrad(const Table& t, const Lookup& l, const void* grad, const long long* unique_ids,
                   const int* counts, const int* starts, const int* num_runs, const int* bag_of,
                   float lr, float eps, float* momentum, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(TT);
  TT* table = static_cast<TT*>(t.data);
  const GT* g = static_cast<const GT*>(grad);
  const bool vec = t.dim % kVec == 0 && Aligned16(t.data) && Aligned16(grad);
  const int v = vec ? kVec : 1;
  const int64_t vectors = (t.dim + v - 1) / v;
  const int chunks = vectors > 128 ? 0 : (vectors >= 32 ? 4 : (vectors >= 16 ? 2 : 1));
  const int group = chunks == 0 ? 32 : GroupFor((vectors + chunks - 1) / chunks, 1);
  const unsigned grid = cuda_util::GridFor(l.num_ids, kWarpsPerBlock * (32 / group));
#define RECFLEET_ADAGRAD(V, C)                                                                \
  AdagradKernel<TT, GT, V, C><<<grid, kWarpsPerBlock * 32, 0, s>>>(                           \
      table, t.dim, g, l, unique_ids, counts, starts, num_runs, bag_of, lr, eps, momentum, group)
  if (vec) {
    switch (chunks) {
      case 1: RECFLEET_ADAGRAD(kVec, 1); break;
      case 2: RECFLEET_ADAGRAD(kVec, 2); break;
      case 4: RECFLEET_ADAGRAD(kVec, 4); break;
      default: RECFLEET_ADAGRAD(kVec, 0); break;
    }
  } else if (chunks != 0) {
    RECFLEET_ADAGRAD(1, 4);
  } else {
    RECFLEET_ADAGRAD(1, 0);
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
  auto layout = [&](Arena& a, long long** keys, long long** sorted_keys, int** bags,
                    int** sorted_bags, long long** unique_ids, int** counts, int** starts,
                    int** num_runs, void** temp) {
    *keys = a.Take<long long>(n);
    *sorted_keys = a.Take<long long>(n);
    *bags = a.Take<int>(n);
    *sorted_bags = a.Take<int>(n);
    *unique_ids = a.Take<long long>(n);
    *counts = a.Take<int>(n);
    *starts = a.Take<int>(n);
    *num_runs = a.Take<int>(1);
    *temp = a.Take<char>(std::max(sort_bytes, std::max(rle_bytes, scan_bytes)));
  };
  long long *keys, *sorted_keys, *unique_ids;
  int *bags, *sorted_bags, *counts, *starts, *num_runs;
  void* temp;
  Arena sizing;
  layout(sizing, &keys, &sorted_keys, &bags, &sorted_bags, &unique_ids, &counts, &starts,
         &num_runs, &temp);
  Arena arena;
  err = cudaMallocAsync(reinterpret_cast<void**>(&arena.base), sizing.used, s);
  if (err != cudaSuccess) return err;
  layout(arena, &keys, &sorted_keys, &bags, &sorted_bags, &unique_ids, &counts, &starts,
         &num_runs, &temp);

  Lookup prep = lookup;
  prep.bags = lookup.offsets != nullptr ? lookup.bags : n;
  PrepareKernel<<<cuda_util::GridFor(prep.bags, kWarpsPerBlock), kWarpsPerBlock * 32, 0, s>>>(
      prep, keys, bags);
  err = cudaGetLastError();
  if (err == cudaSuccess) {
    err = cub::DeviceRadixSort::SortPairs(temp, sort_bytes, keys, sorted_keys, bags, sorted_bags,
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
                                                     starts, num_runs, sorted_bags, learning_rate,
                                                     eps, momentum, s);
      } else {
        LaunchAdagrad<__nv_bfloat16, float>(table, lookup, grad, unique_ids, counts, starts,
                                            num_runs, sorted_bags, learning_rate, eps, momentum,
                                            s);
      }
    } else if (grad_bf16) {
      LaunchAdagrad<float, __nv_bfloat16>(table, lookup, grad, unique_ids, counts, starts,
                                          num_runs, sorted_bags, learning_rate, eps, momentum,
                                          s);
    } else {
      LaunchAdagrad<float, float>(table, lookup, grad, unique_ids, counts, starts, num_runs,
                                  sorted_bags, learning_rate, eps, momentum, s);
    }
    err = cudaGetLastError();
  }
  const cudaError_t free_err = cudaFreeAsync(arena.base, s);
  return err != cudaSuccess ? err : free_err;
}

}  // namespace recfleet::embedding_cuda
