// Hopper (sm_90a) building blocks shared by the warp-specialized attention
// kernels (cuda_wgmma.cu forward, cuda_wgmma_bwd.cu backward): mbarriers,
// named barriers, fences, register reconfiguration, warpgroup MMA (wgmma) on
// 128-byte-swizzled shared-memory tiles, the producer's tile loads (TMA where
// a tile lies inside its sequence, cp.async with zero fill where it crosses
// the end), and the tile scheduler and ring positions both kernels walk.
// The wgmma atoms, their descriptor and the warpgroup fences are CuTe's
// (the pinned nvidia-cutlass wheel's headers, tools/setup.sh and the @cutlass
// repository), which compile to the same SASS as the PTX they replaced. The
// rest stays PTX: CuTe's TMA load and zero-filling cp.async attach L2 cache
// hints, and CUTLASS's barrier wrappers changed ptxas's unrolling and
// register allocation of the main loops (more instructions, more spills);
// bench/RESULTS.md, attention kernels.
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

#include <algorithm>
#include <cstdint>
#include <utility>

#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

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

// Makes barrier initialization visible before the first arrive or wait.
__device__ __forceinline__ void BarInitDone() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Warp specialization: the producer warpgroup gives registers back (to 40),
// the consumer warpgroups take them (232).
__device__ __forceinline__ void ProducerRegs() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
}
__device__ __forceinline__ void ConsumerRegs() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
}

// Plain shared-memory stores at a shared-window address.
__device__ __forceinline__ void StoreShared(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void StoreShared(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}

// ---- wgmma (CuTe: cute/arch/mma_sm90_gmma.hpp, mma_sm90_desc.hpp). ----
namespace GMMA = cute::SM90::GMMA;

// Shared-memory matrix descriptor of a 128-byte-swizzled tile at byte address
// `addr` (1024-aligned atoms): leading and stride byte offsets.
__device__ __forceinline__ uint64_t Desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<uint16_t>((addr & 0x3FFFF) >> 4);
  d.bitfield.leading_byte_offset_ = static_cast<uint16_t>(lbo >> 4);
  d.bitfield.stride_byte_offset_ = static_cast<uint16_t>(sbo >> 4);
  d.bitfield.layout_type_ = static_cast<uint8_t>(GMMA::LayoutType::B128);
  return d.desc_;
}
__device__ __forceinline__ void WgFence() { cute::warpgroup_arrive(); }
__device__ __forceinline__ void WgCommit() { cute::warpgroup_commit_batch(); }
__device__ __forceinline__ void WgWait0() { cute::warpgroup_wait<0>(); }
__device__ __forceinline__ void WgWait1() { cute::warpgroup_wait<1>(); }
// Pins register values at this point of the instruction stream, so that the
// compiler neither moves their computation past a wgmma fence nor touches
// wgmma operands or accumulators before the wait; either makes ptxas
// serialize the wgmma chain (C7511).
template <class T, int N, int M>
__device__ __forceinline__ void FenceRegs(T (&r)[N][M]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int j = 0; j < M; ++j) cute::warpgroup_fence_operand(r[i][j]);
  }
}

namespace detail {
// CuTe's wgmma atoms take the accumulator as N / 2 scalars; these spread
// acc[N / 8][4] over them.
template <class Op, int N, size_t... I>
__device__ __forceinline__ void FmaSS(float (&acc)[N / 8][4], uint64_t a, uint64_t b,
                                      GMMA::ScaleOut scale, std::index_sequence<I...>) {
  Op::fma(a, b, acc[I / 4][I % 4]..., scale);
}
template <class Op, int N, size_t... I>
__device__ __forceinline__ void FmaRS(float (&acc)[N / 8][4], const uint32_t (&a)[4],
                                      uint64_t b, std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], b, acc[I / 4][I % 4]...);
}
template <int N, GMMA::Major kA, GMMA::Major kB>
using SsAtom = std::conditional_t<N == 128, GMMA::MMA_64x128x16_F32BF16BF16_SS<kA, kB>,
                                  GMMA::MMA_64x64x16_F32BF16BF16_SS<kA, kB>>;
constexpr GMMA::Major kRsA = GMMA::Major::K, kRsB = GMMA::Major::MN;  // B read transposed
template <int N>
using RsAtom = std::conditional_t<N == 128, GMMA::MMA_64x128x16_F32BF16BF16_RS<kRsA, kRsB>,
                                  GMMA::MMA_64x64x16_F32BF16BF16_RS<kRsA, kRsB>>;
}  // namespace detail

// acc[64 x N] (+)= A[64 x 16] * B[16 x N], both in shared memory: K-major
// (A[64 x 16], B^T[N x 16]) unless kTransA / kTransB say M- / N-major.
template <int N, int kTransA = 0, int kTransB = 0>
__device__ __forceinline__ void WgmmaSS(float (&acc)[N / 8][4], uint64_t a, uint64_t b,
                                        int accumulate) {
  static_assert(N == 64 || N == 128, "wgmma N");
  constexpr GMMA::Major kA = kTransA ? GMMA::Major::MN : GMMA::Major::K;
  constexpr GMMA::Major kB = kTransB ? GMMA::Major::MN : GMMA::Major::K;
  detail::FmaSS<detail::SsAtom<N, kA, kB>, N>(
      acc, a, b, accumulate ? GMMA::ScaleOut::One : GMMA::ScaleOut::Zero,
      std::make_index_sequence<N / 2>{});
}
// acc[64 x N] += A[64 x 16] (registers) * B[16 x N], B N-major in shared
// memory (the transposed operand).
template <int N>
__device__ __forceinline__ void WgmmaRS(float (&acc)[N / 8][4], const uint32_t (&a)[4],
                                        uint64_t b) {
  static_assert(N == 64 || N == 128, "wgmma N");
  detail::FmaRS<detail::RsAtom<N>, N>(acc, a, b, std::make_index_sequence<N / 2>{});
}

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

// Hides the scores of a warpgroup's partially visible 64 x (8 NT) score tile (bf16 and
// FP8 forwards): `hidden` where
// the key lies outside the row's range. lo_rel and hi_rel are the thread's
// two rows' key ranges relative to its first column (col0 + 2 t), so each
// score costs two compares against immediates and a select.
template <int NT>
__device__ __forceinline__ void HideScores(float (&sc)[NT][4], const int (&lo_rel)[2],
                                           const int (&hi_rel)[2], float hidden) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1, cl = nt * 8 + (e & 1);
      sc[nt][e] = cl >= lo_rel[r] && cl < hi_rel[r] ? sc[nt][e] : hidden;
    }
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

// ---- Forward consumers' turns and shared memory (bf16 and FP8). ----
// Named barriers 1 and 2 order the two consumer warpgroups' GEMM issue
// (barrier 0 is __syncthreads): warpgroup c waits on 1 + c for its turn and
// hands the turn over by arriving on 2 - c.
// KernelParams::wgmma_turns = false turns both into no-ops.
__device__ __forceinline__ void TurnWait(const KernelParams& p, int id) {
  if (p.wgmma_turns) asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(2 * kWgThreads) : "memory");
}
__device__ __forceinline__ void TurnPass(const KernelParams& p, int id) {
  if (p.wgmma_turns) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(2 * kWgThreads) : "memory");
  }
}

// One forward CTA's shared memory (C: FwdConfig of cuda_wgmma.cu, or the
// FP8 forward's Fp8Config): the rings' tiles (stage s at + s * kTileBytes)
// and barriers (stage s at + 8 s): landed (full) and released (empty).
template <class C>
struct FwdSmem {
  uint32_t q, k, v;
  uint32_t k_full, v_full, q_full, k_empty, v_empty, q_empty;
  __device__ explicit FwdSmem(uint32_t base)
      : q(base + C::kQ),
        k(base + C::kK),
        v(base + C::kV),
        k_full(base + C::kBars),
        v_full(k_full + 8 * C::kStages),
        q_full(k_full + 16 * C::kStages),
        k_empty(k_full + 24 * C::kStages),
        v_empty(k_full + 32 * C::kStages),
        q_empty(k_full + 40 * C::kStages) {}
  __device__ uint32_t Tile(uint32_t ring, int stage) const { return ring + stage * C::kTileBytes; }
  // Full barriers: C::kFullArrivals; empty: both consumers' threads.
  __device__ void Init() const {
    for (int s = 0; s < C::kStages; ++s) {
      for (uint32_t f : {k_full, v_full, q_full}) BarInit(f + 8 * s, C::kFullArrivals);
      for (uint32_t e : {k_empty, v_empty, q_empty}) BarInit(e + 8 * s, 2 * kWgThreads);
    }
    BarInitDone();
  }
};

// ---- Tile scheduler and pipeline positions (forward and backward). ----
// Persistent CTAs over the launcher's work items, each item once per head
// (ItemAt): CTA c takes items c, c + grid, c + 2 grid, ..., so with the
// planner's longest-first order the longest start first on every SM. The
// producer and the consumers walk the same sequence.
struct TileScheduler {
  int total;
  __device__ explicit TileScheduler(const KernelParams& p) : total(p.num_items * p.heads) {}
  __device__ int First() const { return blockIdx.x; }
  __device__ bool Valid(int w) const { return w < total; }
  // Unsigned as main's loops had it (a signed add changed the loop's code).
  __device__ int Next(int w) const { return w + gridDim.x; }
  // The CTAs of a launch: one per SM, fewer for fewer items.
  static int Grid(const KernelParams& p, int sms) { return std::min(p.num_items * p.heads, sms); }
};

// The stage and phase (barrier parity) of the iter-th use of a ring of
// kStages stages; the waits on "empty" barriers take the phase flipped, so
// that the first pass through the ring does not wait.
template <int kStages>
struct RingPos {
  int stage, phase;
  // iter >= 0; a power-of-two depth takes a mask and a shift.
  __device__ explicit RingPos(int iter)
      : stage(kPow2 ? static_cast<int>(static_cast<unsigned>(iter) % kStages) : iter % kStages),
        phase((kPow2 ? static_cast<int>(static_cast<unsigned>(iter) / kStages)
                     : iter / kStages) & 1) {}

 private:
  static constexpr bool kPow2 = (kStages & (kStages - 1)) == 0;
};

// ---- Host. ----
// The driver's tensor-map encoder, looked up once through the runtime (no
// link-time dependency on the driver library); null if unavailable.
PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder();
// A tensor map over a [rows, heads, d] tensor whose boxes are 128-byte
// column blocks (64 bf16 columns, or 32 fp32 with f32) of box_rows-row tiles
// of one head, 128-byte swizzled (the layout LoadTile writes). False if the
// tensor does not qualify or the driver's encoder is unavailable.
bool MakeTileMap(CUtensorMap* map, const void* base, int64_t rows, int heads, int d,
                 int box_rows, bool f32 = false);

}  // namespace recfleet::attention::cuda_impl

#endif  // RECFLEET_KERNELS_ATTENTION_CUDA_WGMMA_CUH_
