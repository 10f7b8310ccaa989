// Hopper (sm_90a) building blocks shared by the warp-specialized attention
// kernels (cuda_wgmma.cu forward, cuda_wgmma_bwd.cu backward): mbarriers,
// warpgroup MMA (wgmma) on 128-byte-swizzled shared-memory tiles, and the
// producer's tile loads (TMA where a tile lies inside its sequence, cp.async
// with zero fill where it crosses the end).
//
// Tile layout: a [ROWS][D] bf16 tile is stored as D / 64 column blocks of
// [ROWS][64] (128 bytes a row), and the 16-byte chunk c of row r sits at
// chunk c ^ (r & 7) (the swizzle of the wgmma descriptors and of the TMA
// maps made by MakeTileMap).
//
// Fragment layout of a warpgroup's m64nN fp32 accumulator acc[N / 8][4]
// (warp w of the warpgroup, g = lane / 4, t = lane % 4): acc[nt][e] sits at
// row 16 w + g + 8 (e / 2), column 8 nt + 2 t + e % 2, as in mma.sync.

#ifndef RECFLEET_KERNELS_ATTENTION_CUDA_WGMMA_CUH_
#define RECFLEET_KERNELS_ATTENTION_CUDA_WGMMA_CUH_

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "kernels/attention/cuda_common.cuh"

namespace recfleet::attention::cuda_impl {

constexpr int kWgThreads = 128;

// ---- mbarriers. ----
__device__ __forceinline__ void BarInit(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void BarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void BarWait(uint32_t bar, int parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads.
__device__ __forceinline__ void NamedBarSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives on named barrier `id` (of `threads` threads) without waiting for
// the others, who sync there.
__device__ __forceinline__ void NamedBarArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Makes this thread's generic-proxy shared-memory writes visible to the
// async proxy (wgmma operands, TMA stores).
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- wgmma. ----
// Shared-memory matrix descriptor of a 128-byte-swizzled tile at byte address
// `addr` (1024-aligned atoms): leading and stride byte offsets in 16 bytes.
__device__ __forceinline__ uint64_t Desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(lbo >> 4) << 16) | (static_cast<uint64_t>(sbo >> 4) << 32) |
         (1ull << 62);
}
__device__ __forceinline__ void WgFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgWait0() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
__device__ __forceinline__ void WgWait1() {
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}
// Pins register values at this point of the instruction stream, so that the
// compiler neither moves their computation past a wgmma fence nor touches
// wgmma operands or accumulators before the wait; either makes ptxas
// serialize the wgmma chain (C7511).
template <int N, int M>
__device__ __forceinline__ void FenceRegs(float (&r)[N][M]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int j = 0; j < M; ++j) asm volatile("" : "+f"(r[i][j])::"memory");
  }
}
template <int N, int M>
__device__ __forceinline__ void FenceRegs(uint32_t (&r)[N][M]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int j = 0; j < M; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
  }
}

#define RF_ACC4(a, i) "+f"(a[i][0]), "+f"(a[i][1]), "+f"(a[i][2]), "+f"(a[i][3])
#define RF_ACC32(a)                                                                            \
  RF_ACC4(a, 0), RF_ACC4(a, 1), RF_ACC4(a, 2), RF_ACC4(a, 3), RF_ACC4(a, 4), RF_ACC4(a, 5),    \
      RF_ACC4(a, 6), RF_ACC4(a, 7)
#define RF_ACC64(a)                                                                           \
  RF_ACC32(a), RF_ACC4(a, 8), RF_ACC4(a, 9), RF_ACC4(a, 10), RF_ACC4(a, 11), RF_ACC4(a, 12),  \
      RF_ACC4(a, 13), RF_ACC4(a, 14), RF_ACC4(a, 15)
#define RF_D32                                                                                \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24," \
  "%25,%26,%27,%28,%29,%30,%31}"
#define RF_D64                                                                                 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24," \
  "%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,"   \
  "%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"

// acc[64 x N] (+)= A[64 x 16] * B[16 x N], both in shared memory: K-major
// (A[64 x 16], B^T[N x 16]) unless kTransA / kTransB say M- / N-major.
template <int N, int kTransA = 0, int kTransB = 0>
__device__ __forceinline__ void WgmmaSS(float (&acc)[N / 8][4], uint64_t a, uint64_t b,
                                        int accumulate) {
  static_assert(N == 64 || N == 128, "wgmma N");
  if constexpr (N == 128) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " RF_D64
        ", %64, %65, p, 1, 1, %67, %68;\n"
        "}\n"
        : RF_ACC64(acc)
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " RF_D32
        ", %32, %33, p, 1, 1, %35, %36;\n"
        "}\n"
        : RF_ACC32(acc)
        : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
  }
}
// acc[64 x N] += A[64 x 16] (registers) * B[16 x N], B N-major in shared
// memory (the transposed operand).
template <int N>
__device__ __forceinline__ void WgmmaRS(float (&acc)[N / 8][4], const uint32_t (&a)[4],
                                        uint64_t b) {
  static_assert(N == 64 || N == 128, "wgmma N");
  if constexpr (N == 128) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " RF_D64
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n"
        "}\n"
        : RF_ACC64(acc)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " RF_D32
        ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n"
        "}\n"
        : RF_ACC32(acc)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
}
#undef RF_ACC4
#undef RF_ACC32
#undef RF_ACC64
#undef RF_D32
#undef RF_D64

// acc[64 x N] (+)= A[64 x D] * B[N x D]^T: A the 64 rows of a tile at
// `a_rows` (tile of A_ROWS rows), B an N-row tile, both K-major, D / 16 k16
// steps. Not committed (callers batch GEMMs into one group).
template <int D, int N, int A_ROWS>
__device__ __forceinline__ void GemmSS(float (&acc)[N / 8][4], uint32_t a_rows, uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t col = (kk & 3) * 32;
    WgmmaSS<N>(acc, Desc(a_rows + (kk >> 2) * (A_ROWS * 128) + col, 16, 1024),
               Desc(b + (kk >> 2) * (N * 128) + col, 16, 1024), kk > 0);
  }
}

// acc[64 x D] += P[64 x K] * B[K x D]: P as bf16 A fragments (PackA), B the
// K-row tile at `b` read N-major (its D / 64 column blocks K * 128 bytes
// apart). Not committed.
template <int D, int K>
__device__ __forceinline__ void GemmRS(float (&acc)[D / 8][4], const uint32_t (&pa)[K / 16][4],
                                       uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    WgmmaRS<D>(acc, pa[kk], Desc(b + kk * 16 * 128, K * 128, 1024));
  }
}

// The bf16 A fragments of a following GEMM from an fp32 accumulator: the
// accumulator's 64 x N tile becomes the A operand [64 x K = N].
template <int N>
__device__ __forceinline__ void PackA(const float (&sc)[N / 8][4], uint32_t (&pa)[N / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    pa[kk][0] = Pack(sc[2 * kk][0], sc[2 * kk][1]);
    pa[kk][1] = Pack(sc[2 * kk][2], sc[2 * kk][3]);
    pa[kk][2] = Pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
    pa[kk][3] = Pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
  }
}

// ---- Producer: tile loads. ----
// Byte offset of element (row, col) in a swizzled [ROWS][D] tile.
template <int ROWS>
__device__ __forceinline__ uint32_t SwzOffset(int row, int col) {
  return (col >> 6) * (ROWS * 128) + row * 128 + ((((col >> 3) & 7) ^ (row & 7)) << 4);
}

// Starts copying rows [row0, row0 + ROWS) of one head into a swizzled tile;
// rows outside [0, len) are zero-filled. Called by the 128 producer threads.
// Thread tid copies the 16-byte chunk tid % (D / 8) of rows tid / (D / 8) +
// (1024 / D) i: its rows share row % 8, hence the swizzled chunk, so source
// and destination step by constants (the producer runs on few registers;
// this path serves the tiles that cross a sequence end, TMA the others).
template <int D, int ROWS>
__device__ __forceinline__ void LoadTile(uint32_t s, const bf16* g, int64_t start, int row0,
                                         int len, int head, int heads, int tid) {
  constexpr int kChunks = D / 8, kRowStep = kWgThreads / kChunks;
  const int r0 = tid / kChunks, c = (tid % kChunks) * 8;
  const uint32_t dst = s + SwzOffset<ROWS>(r0, c);
  const int64_t step = static_cast<int64_t>(kRowStep) * heads * D;
  const bf16* src = g + ((start + row0 + r0) * heads + head) * D + c;
#pragma unroll 4
  for (int i = 0; i < ROWS / kRowStep; ++i) {
    const int row = row0 + r0 + kRowStep * i;
    const bool ok = row >= 0 && row < len;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst + i * kRowStep * 128),
                 "l"(ok ? src + i * step : g), "r"(ok ? 16 : 0));
  }
}

// Waits for this thread's copies, makes them visible to the wgmma (async)
// proxy, and arrives on `bar`.
__device__ __forceinline__ void CopiesDone(uint32_t bar) {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
  FenceProxyAsync();
  BarArrive(bar);
}

// One 64-column block of a tile (box rows x 128 bytes, the same 128-byte
// swizzle) by TMA, completing on `bar`. Coordinates: column, head, row.
__device__ __forceinline__ void TmaLoadBlock(uint32_t dst, const CUtensorMap* map, int col,
                                             int head, int row, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(head), "r"(row), "r"(bar)
      : "memory");
}

// Adds the fp32 box at `src` (shared memory, in the map's layout) into
// global memory at (column, head, row) by TMA, as one bulk
// group of this thread.
__device__ __forceinline__ void TmaReduceAdd(const CUtensorMap* map, uint32_t src, int col,
                                             int head, int row) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, "
      "%3}], [%4];\n"
      "cp.async.bulk.commit_group;\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(col), "r"(head), "r"(row), "r"(src)
      : "memory");
}
// Waits until this thread's bulk groups have read their shared memory
// (kRead) or completed.
template <bool kRead>
__device__ __forceinline__ void BulkWait() {
  if constexpr (kRead) {
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  } else {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  }
}

// Fills the swizzled tile `s` with rows [row0, row0 + ROWS) of one head and
// arrives on `bar` (count: the 128 producer threads): one thread issues the
// TMA copies (`map`'s box: 64 columns x ROWS rows) when every row lies inside
// the sequence, otherwise all threads copy with cp.async, zero-filling the
// rows outside.
template <int D, int ROWS>
__device__ __forceinline__ void FillTile(uint32_t s, const CUtensorMap* map, bool tma,
                                         const bf16* g, int64_t start, int row0, int len, int head,
                                         int heads, int tid, uint32_t bar) {
  if (tma && row0 >= 0 && row0 + ROWS <= len) {
    if (tid == 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                   "n"(ROWS * D * 2)
                   : "memory");
      const int row = static_cast<int>(start + row0);
#pragma unroll
      for (int b = 0; b < D / 64; ++b) {
        TmaLoadBlock(s + b * ROWS * 128, map, 64 * b, head, row, bar);
      }
    } else {
      BarArrive(bar);
    }
  } else {
    LoadTile<D, ROWS>(s, g, start, row0, len, head, heads, tid);
    CopiesDone(bar);
  }
}

// ---- Host. ----
// A tensor map over a [rows, heads, d] tensor whose boxes are 128-byte
// column blocks (64 bf16 columns, or 32 fp32 with f32) of box_rows-row tiles
// of one head, 128-byte swizzled (the layout LoadTile writes). False if the
// tensor does not qualify or the driver's encoder is unavailable.
bool MakeTileMap(CUtensorMap* map, const void* base, int64_t rows, int heads, int d,
                 int box_rows, bool f32 = false);

}  // namespace recfleet::attention::cuda_impl

#endif  // RECFLEET_KERNELS_ATTENTION_CUDA_WGMMA_CUH_
