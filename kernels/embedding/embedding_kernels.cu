#include "kernels/embedding/embedding_kernels.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

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

// The same Adagrad step with a block per tile of consecutive sorted
// positions: the table row and momentum of each of the tile's owners, and
// the gradient row of each of its positions (most later occurrences of an
// owner's id sit in the same tile), are copied into shared memory by
// cp.async before any is used. The register kernel above holds its rows in
// registers, so its loads in flight are capped by occupancy (32 B of row per
// lane, ~32 KB per SM); here a block keeps up to 64 KB of rows and
// gradients in flight without holding a register for them, and the keys
// and bags of the tile (with a halo on each side for bucket runs crossing
// its edges) are read once, coalesced, so finding owners and their later
// occurrences costs shared-memory reads instead of dependent global loads.
//
// Rows of at most 512 bytes (table and gradient) whose length is a multiple
// of 16 bytes; `positions` (a multiple of 32, at most the block size) sorted
// positions per block. Owners are compacted in position order, then a group
// of `lanes` lanes (a power of two covering the row's 16-byte chunks) per
// owner updates its row: the same fp32 sums as the register kernel (first
// occurrence, then the later ones in sorted order).
constexpr int kStagedThreads = 256;
constexpr int kStagedHalo = 32;

// Sorted keys and bags of [first, first + count) from shared memory, others
// from global memory.
struct StagedKeys {
  const int64_t* s_keys;
  const int* s_bags;
  int64_t first, count;
  const void* keys;
  bool keys32;
  const int* bag_of;
  __device__ __forceinline__ bool Staged(int64_t q) const {
    return q >= first && q < first + count;
  }
  __device__ __forceinline__ int64_t operator()(int64_t q) const {
    return Staged(q) ? s_keys[q - first] : SortedKey(keys, keys32, q);
  }
  __device__ __forceinline__ int64_t Bag(int64_t q) const {
    return Staged(q) ? s_bags[q - first] : __ldg(bag_of + q);
  }
};

// Asynchronous copies global -> shared, without an L2 cache policy: nvcc
// 13.0's ptxas miscompiles cp.async with a fractional policy (an illegal
// instruction at run time on the H200), so the table rows read here enter
// L2 at normal priority and only their write-back is marked evict-first.
__device__ __forceinline__ void CopyAsync16(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem) : "memory");
}

__device__ __forceinline__ void CopyAsync4(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(gmem) : "memory");
}

// V elements of type T from shared memory (16-byte aligned when V *
// sizeof(T) >= 16) as fp32.
template <typename T, int V>
__device__ __forceinline__ void LoadShared(const T* p, float (&out)[V]) {
  if constexpr (V * sizeof(T) % 16 == 0) {
#pragma unroll
    for (int k = 0; k < static_cast<int>(V * sizeof(T) / 16); ++k) {
      const uint4 raw = reinterpret_cast<const uint4*>(p)[k];
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < static_cast<int>(16 / sizeof(T)); ++i) {
        out[k * (16 / sizeof(T)) + i] = cuda_util::ToFloat(e[i]);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = cuda_util::ToFloat(p[i]);
  }
}

__device__ __forceinline__ float BagScale(const Lookup& l, int64_t bag) {
  if (!l.mean) return 1.0f;
  int64_t b0, b1;
  BagBounds(l, bag, &b0, &b1);
  return 1.0f / static_cast<float>(b1 - b0);
}

// Shared-memory bytes of one block of the staged kernel.
size_t StagedSharedBytes(int positions, int64_t row_bytes, int64_t grad_bytes) {
  const int keyed = positions + 2 * kStagedHalo;
  return static_cast<size_t>(positions) * (row_bytes + grad_bytes) +
         static_cast<size_t>(keyed) * (sizeof(int64_t) + sizeof(int)) +
         static_cast<size_t>(positions) * (sizeof(int) + 2 * sizeof(float)) +
         (kStagedThreads / 32 + 1) * sizeof(int);
}

template <typename TT, typename GT>
__global__ void __launch_bounds__(kStagedThreads, 3)
    StagedAdagradKernel(TT* __restrict__ table, int64_t dim, const GT* __restrict__ grad,
                        Lookup l, const void* __restrict__ keys, bool keys32, int lo,
                        const int* __restrict__ bag_of, int64_t n, float lr, float eps,
                        float* __restrict__ momentum, int positions, int lanes) {
  constexpr int V = 16 / sizeof(TT);  // elements per lane: one 16-byte table chunk
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t row_bytes = dim * static_cast<int64_t>(sizeof(TT));
  const int64_t grad_bytes = dim * static_cast<int64_t>(sizeof(GT));
  const int keyed = positions + 2 * kStagedHalo;
  unsigned char* s_rows = smem;
  unsigned char* s_grads = s_rows + positions * row_bytes;
  int64_t* s_keys = reinterpret_cast<int64_t*>(s_grads + positions * grad_bytes);
  int* s_bags = reinterpret_cast<int*>(s_keys + keyed);
  int* s_owner = s_bags + keyed;  // tile-relative position of each owner
  float* s_mom = reinterpret_cast<float*>(s_owner + positions);
  float* s_scale = s_mom + positions;
  int* s_counts = reinterpret_cast<int*>(s_scale + positions);  // per warp, then the total

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * positions;
  const int64_t first = base - kStagedHalo;
  for (int i = tid; i < keyed; i += kStagedThreads) {
    const int64_t q = first + i;
    if (q >= 0 && q < n) {
      s_keys[i] = SortedKey(keys, keys32, q);
      s_bags[i] = __ldg(bag_of + q);
    }
  }
  __syncthreads();
  const int64_t staged_count = min(static_cast<int64_t>(keyed), n - first);
  const StagedKeys key_at{s_keys, s_bags, first, staged_count, keys, keys32, bag_of};

  // Owners of the tile, compacted in position order.
  const int64_t p = base + tid;
  bool owner = false;
  if (tid < positions && p < n) {
    owner = sorted_runs::FirstOccurrence(key_at, p, s_keys[kStagedHalo + tid], lo);
  }
  const unsigned ballot = __ballot_sync(0xffffffffu, owner);
  if (lane == 0) s_counts[warp] = __popc(ballot);
  __syncthreads();
  int slot = __popc(ballot & ((1u << lane) - 1));
  for (int w = 0; w < warp; ++w) slot += s_counts[w];
  if (owner) {
    s_owner[slot] = tid;
    s_scale[slot] = BagScale(l, s_bags[kStagedHalo + tid]);
  }
  if (tid == kStagedThreads - 1) s_counts[kStagedThreads / 32] = slot + (owner ? 1 : 0);
  __syncthreads();
  const int count = s_counts[kStagedThreads / 32];

  // Every owner's table row and momentum and every position's gradient row,
  // in flight together.
  {
    const int row_chunks = static_cast<int>(row_bytes / 16);
    for (int c = tid; c < count * row_chunks; c += kStagedThreads) {
      const int k = c / row_chunks, j = c - k * row_chunks;
      const int64_t id = s_keys[kStagedHalo + s_owner[k]];
      CopyAsync16(s_rows + k * row_bytes + j * 16,
                  reinterpret_cast<const unsigned char*>(table + id * dim) + j * 16);
    }
    const int grad_chunks = static_cast<int>(grad_bytes / 16);
    const int tile = static_cast<int>(min(static_cast<int64_t>(positions), n - base));
    for (int c = tid; c < tile * grad_chunks; c += kStagedThreads) {
      const int t = c / grad_chunks, j = c - t * grad_chunks;
      const int64_t bag = s_bags[kStagedHalo + t];
      CopyAsync16(s_grads + t * grad_bytes + j * 16,
                  reinterpret_cast<const unsigned char*>(grad + bag * dim) + j * 16);
    }
    if (tid < count) CopyAsync4(s_mom + tid, momentum + s_keys[kStagedHalo + s_owner[tid]]);
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
  }
  __syncthreads();

  // A group of `lanes` lanes per owner, V columns per lane.
  const int groups = kStagedThreads / lanes, sub = tid & (lanes - 1);
  const int64_t d0 = static_cast<int64_t>(sub) * V;
  const bool has_cols = d0 < dim;
  const uint64_t policy = EvictFirstPolicy();
  for (int k0 = 0; k0 < count; k0 += groups) {  // block-uniform: the shuffles need every lane
    const int k = k0 + tid / lanes;
    const bool active = k < count;
    float w[V], g[V];
    float sq = 0.0f;
    int64_t id = 0;
    if (active && has_cols) {
      const int t = s_owner[k];
      id = s_keys[kStagedHalo + t];
      LoadShared<TT, V>(reinterpret_cast<const TT*>(s_rows + k * row_bytes) + d0, w);
      LoadShared<GT, V>(reinterpret_cast<const GT*>(s_grads + t * grad_bytes) + d0, g);
      const float scale = s_scale[k];
#pragma unroll
      for (int j = 0; j < V; ++j) g[j] *= scale;
      sorted_runs::ForEachLaterOccurrence(key_at, n, base + t, id, lo, [&](int64_t q) {
        const int64_t bag = key_at.Bag(q);
        const float s = BagScale(l, bag);
        float v[V];
        if (q - base < positions) {
          LoadShared<GT, V>(
              reinterpret_cast<const GT*>(s_grads + (q - base) * grad_bytes) + d0, v);
        } else {
          LoadVec<GT, V>(grad + bag * dim + d0, v);
        }
#pragma unroll
        for (int j = 0; j < V; ++j) g[j] += s * v[j];
      });
#pragma unroll
      for (int j = 0; j < V; ++j) sq += g[j] * g[j];
    }
    const float m = (active ? s_mom[k] : 0.0f) + GroupSum(sq, lanes) / static_cast<float>(dim);
    if (active && has_cols) {
      const float step = lr / (sqrtf(m) + eps);
      if (sub == 0) StoreMomentum(momentum + id, policy, m);
#pragma unroll
      for (int j = 0; j < V; ++j) w[j] -= step * g[j];
      StoreRow<TT, V>(table + id * dim + d0, policy, w);
    }
  }
}

// RECFLEET_EMBEDDING_ADAGRAD=registers selects the register kernel for
// every shape (the staged one is the default where rows fit it); read per
// call so that tests and benchmarks can compare both in one process.
bool UseStagedAdagrad() {
  const char* mode = std::getenv("RECFLEET_EMBEDDING_ADAGRAD");
  return mode == nullptr || std::strcmp(mode, "registers") != 0;
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
cudaError_t LaunchAdagrad(const Table& t, const Lookup& l, const void* grad, const void* keys,
                          bool keys32, int lo, const int* bag_of, float lr, float eps,
                          float* momentum, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(TT);
  TT* table = static_cast<TT*>(t.data);
  const GT* g = static_cast<const GT*>(grad);
  const int64_t row_bytes = t.dim * static_cast<int64_t>(sizeof(TT));
  const int64_t grad_bytes = t.dim * static_cast<int64_t>(sizeof(GT));
  if (UseStagedAdagrad() && row_bytes % 16 == 0 && grad_bytes % 16 == 0 && row_bytes <= 512 &&
      grad_bytes <= 512 && Aligned16(t.data) && Aligned16(grad)) {
    // About 64 KB of rows and gradients per block: three blocks per SM.
    const char* tile_env = std::getenv("RECFLEET_EMBEDDING_ADAGRAD_TILE_BYTES");
    const int64_t tile_bytes = tile_env != nullptr ? std::atoll(tile_env) : 65536;
    const int positions = static_cast<int>(std::max<int64_t>(
        32, std::min<int64_t>(kStagedThreads, tile_bytes / (row_bytes + grad_bytes) / 32 * 32)));
    const int lanes = GroupFor(row_bytes / 16, 1);
    const size_t smem = StagedSharedBytes(positions, row_bytes, grad_bytes);
    auto kernel = StagedAdagradKernel<TT, GT>;
    cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess) {
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    }
    if (err != cudaSuccess) return err;
    kernel<<<cuda_util::GridFor(l.num_ids, positions), kStagedThreads, smem, s>>>(
        table, t.dim, g, l, keys, keys32, lo, bag_of, l.num_ids, lr, eps, momentum, positions,
        lanes);
    return cudaGetLastError();
  }
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
  return cudaGetLastError();
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
      return LaunchAdagrad<decltype(table_elem), decltype(grad_elem)>(
          table, lookup, grad, sorted_keys, keys32, lo, sorted_bags, learning_rate, eps, momentum,
          s);
    };
    if (table.bf16) {
      err = grad_bf16 ? launch(__nv_bfloat16{}, __nv_bfloat16{})
                      : launch(__nv_bfloat16{}, float{});
    } else {
      err = grad_bf16 ? launch(float{}, __nv_bfloat16{}) : launch(float{}, float{});
    }
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
