#include "kernels/embedding/embedding_kernels.h"

#include <cub/cub.cuh>

#include "kernels/base/cuda_util.h"
#include "kernels/embedding/sorted_runs.h"

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

// Writes the sort input: key = id (32 bits when the table has fewer than
// 2^32 rows, which makes every sort pass move 8 instead of 12 bytes per id),
// value = the bag (output row) the id contributes to. One warp per bag, so
// writes coalesce.
template <typename KeyT>
__global__ void PrepareKernel(Lookup l, KeyT* __restrict__ keys, int* __restrict__ bag_of) {
  const int lane = threadIdx.x & 31;
  const int64_t bag = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (bag >= l.bags) return;
  int64_t begin, end;
  BagBounds(l, bag, &begin, &end);
  for (int64_t i = begin + lane; i < end; i += 32) {
    keys[i] = static_cast<KeyT>(LoadIndex(l.ids, l.ids64, i));
    bag_of[i] = static_cast<int>(bag);
  }
}

// Adds this lane's C chunks of V columns (chunk c at column d0 + c*stride)
// of one occurrence's (mean-scaled) output-gradient row to g.
template <typename GT, int V, int C>
__device__ __forceinline__ void AddGradRow(const GT* __restrict__ grad, int64_t dim, int64_t d0,
                                           int64_t stride, const Lookup& l, int64_t bag,
                                           float (&g)[C][V]) {
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

// Sorted key at position p (32- or 64-bit keys).
__device__ __forceinline__ int64_t SortedKey(const void* keys, bool keys32, int64_t p) {
  return keys32 ? static_cast<int64_t>(__ldg(static_cast<const unsigned*>(keys) + p))
                : static_cast<int64_t>(__ldg(static_cast<const unsigned long long*>(keys) + p));
}

// The sorted key at position q, as sorted_runs wants it.
struct SortedKeys {
  const void* keys;
  bool keys32;
  __device__ __forceinline__ int64_t operator()(int64_t q) const {
    return SortedKey(keys, keys32, q);
  }
};

// The gradient of one distinct id: the sum of the rows of its occurrences,
// the first at position `start` (bag first_bag), the others found by
// sorted_runs::ForEachLaterOccurrence.
template <typename GT, int V, int C>
__device__ __forceinline__ void GatherGrad(const GT* __restrict__ grad, int64_t dim, int64_t d0,
                                           int64_t stride, const Lookup& l,
                                           const SortedKeys& key_at, int64_t n, int lo,
                                           int64_t id, const int* __restrict__ bag_of,
                                           int64_t first_bag, int64_t start, float (&g)[C][V]) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
#pragma unroll
    for (int j = 0; j < V; ++j) g[c][j] = 0.0f;
  }
  AddGradRow<GT, V, C>(grad, dim, d0, stride, l, first_bag, g);
  sorted_runs::ForEachLaterOccurrence(key_at, n, start, id, lo, [&](int64_t q) {
    AddGradRow<GT, V, C>(grad, dim, d0, stride, l, __ldg(bag_of + q), g);
  });
}

// Sum over the `group` lanes of one run (xor offsets stay inside a group).
__device__ __forceinline__ float GroupSum(float v, int group) {
  for (int o = group >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// L2 policy for the bytes an Adagrad step touches once: table rows and
// momentum (read, then written back). Marked evict-first, they leave L2
// before the output gradient, which every occurrence of a bag reads again
// (in the benchmark, 17 MB of gradient against 1 GB of rows passing
// through).
// Volatile, so each call site makes its own (one instruction) and the
// policy register is not held live across the gradient gather.
__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// V elements of a table row under `policy` (16-byte vectors; other widths
// take the plain path). The row is written back only by the same lanes, so
// the read-only path is safe.
template <typename T, int V>
__device__ __forceinline__ void LoadRow(const T* p, uint64_t policy, float (&out)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    uint4 raw;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
                 : "l"(p), "l"(policy));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = cuda_util::ToFloat(e[i]);
  } else {
    LoadVec<T, V>(p, out);
  }
}

template <typename T, int V>
__device__ __forceinline__ void StoreRow(T* p, uint64_t policy, const float (&in)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < V; ++i) e[i] = cuda_util::FromFloat<T>(in[i]);
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p),
                 "r"(raw.x), "r"(raw.y), "r"(raw.z), "r"(raw.w), "l"(policy)
                 : "memory");
  } else {
    StoreVec<T, V>(p, in);
  }
}

__device__ __forceinline__ float LoadMomentum(const float* p, uint64_t policy) {
  float v;
  asm volatile("ld.global.L2::cache_hint.f32 %0, [%1], %2;" : "=f"(v) : "l"(p), "l"(policy));
  return v;
}

__device__ __forceinline__ void StoreMomentum(float* p, uint64_t policy, float v) {
  asm volatile("st.global.L2::cache_hint.f32 [%0], %1, %2;" ::"l"(p), "f"(v), "l"(policy)
               : "memory");
}

// A group of lanes per sorted position; the group at the first position of
// an id in its bucket run (its owner) gathers the id's gradient and applies
// one rowwise Adagrad step to its table row and momentum; the other groups
// stay idle. Finding owners straight from the sorted keys needs no
// run-length encoding, and puts the table row, the momentum and the first
// gradient row one dependent load after the key (the position's key, its
// predecessor and its bag are loaded together). Each lane holds C chunks of
// V columns, so a warp serves several positions with several independent
// loads per lane in flight. C == 0: rows longer than a group's registers;
// the gradient is gathered twice (squared norm, then update), one chunk at
// a time.
//
// The kernel is latency-bound, so it asks for as many resident blocks as its
// registers allow without spilling much: 4 (64 registers), 3 for 16 fp32
// columns per lane, 2 for 32 columns. Table rows and momentum go through L2
// under the evict-first policy (EvictFirstPolicy).
template <typename TT, typename GT, int V, int C>
__global__ void __launch_bounds__(kWarpsPerBlock * 32,
                                  C * V >= 32 ? 2 : (C * V >= 16 && sizeof(TT) == 4 ? 3 : 4))
    AdagradKernel(TT* __restrict__ table, int64_t dim, const GT* __restrict__ grad, Lookup l,
                  const void* __restrict__ keys, bool keys32, int lo,
                  const int* __restrict__ bag_of, int64_t n, float lr, float eps,
                  float* __restrict__ momentum, int group) {
  const int lane = threadIdx.x & 31;
  const int sub = lane & (group - 1);
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5)) *
                        (32 / group);
  if (first >= n) return;  // whole warp: the shuffles below need every lane
  const int64_t p = first + lane / group;
  const SortedKeys key_at{keys, keys32};
  int64_t id = -1;
  bool active = false;
  int64_t bag0 = 0;
  if (p < n) {
    id = key_at(p);
    bag0 = __ldg(bag_of + p);
    active = sorted_runs::FirstOccurrence(key_at, p, id, lo);
  }
  TT* row = table + (active ? id : 0) * dim;
  float m0 = 0.0f;
  if (active) m0 = LoadMomentum(momentum + id, EvictFirstPolicy());
  const int64_t d0 = static_cast<int64_t>(sub) * V, stride = static_cast<int64_t>(group) * V;
  if constexpr (C > 0) {
    float w[C][V], g[C][V];
    float sq = 0.0f;
    if (active) {
      const uint64_t policy = EvictFirstPolicy();
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (d0 + c * stride < dim) LoadRow<TT, V>(row + d0 + c * stride, policy, w[c]);
      }
      // The first occurrence's gradient row is loaded before looking for
      // more (most ids occur once), so its loads overlap the table row's.
      GatherGrad<GT, V, C>(grad, dim, d0, stride, l, key_at, n, lo, id, bag_of, bag0, p, g);
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
    if (active && sub == 0) StoreMomentum(momentum + id, EvictFirstPolicy(), m);
    if (active) {
      const uint64_t policy = EvictFirstPolicy();
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (d0 + c * stride < dim) {
#pragma unroll
          for (int j = 0; j < V; ++j) w[c][j] -= step * g[c][j];
          StoreRow<TT, V>(row + d0 + c * stride, policy, w[c]);
        }
      }
    }
  } else {
    float sq = 0.0f;
    for (int64_t d = d0; active && d < dim; d += stride) {
      float g[1][V];
      GatherGrad<GT, V, 1>(grad, dim, d, stride, l, key_at, n, lo, id, bag_of, bag0, p, g);
#pragma unroll
      for (int j = 0; j < V; ++j) sq += g[0][j] * g[0][j];
    }
    const float m = m0 + GroupSum(sq, group) / static_cast<float>(dim);
    const float step = lr / (sqrtf(m) + eps);
    if (active && sub == 0) StoreMomentum(momentum + id, EvictFirstPolicy(), m);
    for (int64_t d = d0; active && d < dim; d += stride) {
      const uint64_t policy = EvictFirstPolicy();
      float g[1][V], w[V];
      LoadRow<TT, V>(row + d, policy, w);
      GatherGrad<GT, V, 1>(grad, dim, d, stride, l, key_at, n, lo, id, bag_of, bag0, p, g);
#pragma unroll
      for (int j = 0; j < V; ++j) w[j] -= step * g[0][j];
      StoreRow<TT, V>(row + d, policy, w);
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
void LaunchAdagrad(const Table& t, const Lookup& l, const void* grad, const void* keys,
                   bool keys32, int lo, const int* bag_of, float lr, float eps, float* momentum,
                   cudaStream_t s) {
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
      table, t.dim, g, l, keys, keys32, lo, bag_of, l.num_ids, lr, eps, momentum, group)
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

namespace {

template <typename KeyT>
cudaError_t BackwardAdagradImpl(const Table& table, const Lookup& lookup, const void* grad,
                                bool grad_bf16, float learning_rate, float eps, float* momentum,
                                cudaStream_t s) {
  const int64_t n = lookup.num_ids;
  const int bits = KeyBits(table.rows);
  constexpr bool keys32 = sizeof(KeyT) == 4;
  // Sorting by id >> lo saves a radix pass where lo > 0; the Adagrad kernel
  // then finds each id's occurrences inside its bucket run.
  const int lo = sorted_runs::LowBitsToSkip(bits);

  // Temporary storage: sized in a dry run of the arena (null base), then
  // allocated once.
  size_t sort_bytes = 0;
  cudaError_t err = cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const KeyT*>(nullptr), static_cast<KeyT*>(nullptr),
      static_cast<const int*>(nullptr), static_cast<int*>(nullptr), static_cast<int>(n), lo, bits,
      s);
  if (err != cudaSuccess) return err;
  auto layout = [&](Arena& a, KeyT** keys, KeyT** sorted_keys, int** bags, int** sorted_bags,
                    void** temp) {
    *keys = a.Take<KeyT>(n);
    *sorted_keys = a.Take<KeyT>(n);
    *bags = a.Take<int>(n);
    *sorted_bags = a.Take<int>(n);
    *temp = a.Take<char>(sort_bytes);
  };
  KeyT *keys, *sorted_keys;
  int *bags, *sorted_bags;
  void* temp;
  Arena sizing;
  layout(sizing, &keys, &sorted_keys, &bags, &sorted_bags, &temp);
  Arena arena;
  err = cudaMallocAsync(reinterpret_cast<void**>(&arena.base), sizing.used, s);
  if (err != cudaSuccess) return err;
  layout(arena, &keys, &sorted_keys, &bags, &sorted_bags, &temp);

  Lookup prep = lookup;
  prep.bags = lookup.offsets != nullptr ? lookup.bags : n;
  PrepareKernel<KeyT><<<cuda_util::GridFor(prep.bags, kWarpsPerBlock), kWarpsPerBlock * 32, 0, s>>>(
      prep, keys, bags);
  err = cudaGetLastError();
  if (err == cudaSuccess) {
    err = cub::DeviceRadixSort::SortPairs(temp, sort_bytes, keys, sorted_keys, bags, sorted_bags,
                                          static_cast<int>(n), lo, bits, s);
  }
  if (err == cudaSuccess) {
    // Table and gradient element types as template arguments.
    auto launch = [&](auto table_elem, auto grad_elem) {
      LaunchAdagrad<decltype(table_elem), decltype(grad_elem)>(
          table, lookup, grad, sorted_keys, keys32, lo, sorted_bags, learning_rate, eps, momentum,
          s);
    };
    if (table.bf16) {
      grad_bf16 ? launch(__nv_bfloat16{}, __nv_bfloat16{}) : launch(__nv_bfloat16{}, float{});
    } else {
      grad_bf16 ? launch(float{}, __nv_bfloat16{}) : launch(float{}, float{});
    }
    err = cudaGetLastError();
  }
  const cudaError_t free_err = cudaFreeAsync(arena.base, s);
  return err != cudaSuccess ? err : free_err;
}

}  // namespace

cudaError_t BackwardAdagrad(const Table& table, const Lookup& lookup, const void* grad,
                            bool grad_bf16, float learning_rate, float eps, float* momentum,
                            void* stream) {
  const int64_t n = lookup.num_ids;
  if (n == 0) return cudaSuccess;
  if (n > INT32_MAX) return cudaErrorInvalidValue;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (table.rows <= (int64_t{1} << 32)) {
    return BackwardAdagradImpl<unsigned>(table, lookup, grad, grad_bf16, learning_rate, eps,
                                         momentum, s);
  }
  return BackwardAdagradImpl<unsigned long long>(table, lookup, grad, grad_bf16, learning_rate,
                                                 eps, momentum, s);
}

}  // namespace recfleet::embedding_cuda
