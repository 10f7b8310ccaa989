// Hopper forward of the jagged attention at head dim 128 (any activation,
// mask and bias): warpgroup MMA (wgmma) from shared memory, warp-specialized.
//
// A persistent CTA has three warpgroups. Warpgroup 2 is the producer: it
// streams the 128-row query tiles and 128-row K/V tiles of its work items
// into shared memory, by TMA (one thread, two bulk tensor copies a tile)
// where the tile lies inside its sequence and by cp.async with zero fill
// where it crosses the sequence end. Query tiles go through a two-stage
// ring of their own (the next item's Q loads while the current item
// computes, which matters for the short-K/V shapes with one or two K/V
// tiles per item), K and V through two-stage rings with separate barriers
// (K_n is released when S_n is done, V_n only after P_n V_n, one step
// later). It hands most of its registers to the consumers
// (setmaxnreg; wgmma kernels are allocated registers per warpgroup, so a
// lone producer warp would cost as much). Warpgroups 0 and 1 each own 64 of
// the tile's query rows: S = Q K^T is one m64n128 wgmma chain with both
// operands in shared memory, the activation (online softmax, or GELU/SiLU
// without running max/sum) runs on the accumulator registers, and O += P V
// takes P from registers and V from shared memory (transposed operand). The
// two consumers take turns issuing their GEMMs (named barriers), so one's
// activation runs while the other's GEMMs keep the tensor cores busy, and
// each issues S_n together with P_{n-1} V_{n-1} (FlashAttention-3's
// ping-pong and intra-warpgroup overlap). Items are the launcher's
// longest-first forward tiles; CTA c takes items c, c + grid, c + 2 grid,
// ... so the longest start first on every SM. An item may cover up to
// kWgmmaMaxGroup consecutive query tiles that see the same K/V rows (at
// most two K/V tiles: short-K/V cross-attention, PMA); its K/V tiles then
// load once and stay resident while its query tiles pass.
//
// Shared-memory tiles use the 128-byte swizzle of the wgmma descriptors: a
// [rows][128] bf16 tile is stored as two [rows][64] halves (128 bytes a
// row), and the 16-byte chunk c of row r sits at chunk c ^ (r & 7).

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cmath>
#include <cstdint>

#include "kernels/attention/cuda_common.cuh"

namespace recfleet::attention::cuda_impl {
namespace {

constexpr int kD = 128;
constexpr int kRowsQ = 128;     // query rows per work item (kForwardTileRows)
constexpr int kRowsKv = 128;    // keys per K/V tile
constexpr int kWgThreads = 128;
constexpr int kCtaThreads = 3 * kWgThreads;
constexpr int kTileBytes = 128 * kD * 2;  // one 128 x 128 bf16 tile
// Two stages each of Q, K and V, the barriers; plus slack to align to 1024.
constexpr int kSmemBytes = 6 * kTileBytes + 128 + 1024;
static_assert(12 * 8 <= 128, "the barriers fit their 128 bytes");

static_assert(kForwardTileRows == kRowsQ, "the planner's forward tiles must be 128 rows");

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
#define RF_ACC64(a)                                                                           \
  RF_ACC4(a, 0), RF_ACC4(a, 1), RF_ACC4(a, 2), RF_ACC4(a, 3), RF_ACC4(a, 4), RF_ACC4(a, 5),   \
      RF_ACC4(a, 6), RF_ACC4(a, 7), RF_ACC4(a, 8), RF_ACC4(a, 9), RF_ACC4(a, 10),            \
      RF_ACC4(a, 11), RF_ACC4(a, 12), RF_ACC4(a, 13), RF_ACC4(a, 14), RF_ACC4(a, 15)
#define RF_D64                                                                                 \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24," \
  "%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,"   \
  "%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"

// acc[64 x 128] (+)= A[64 x 16] * B[128 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void WgmmaSS(float (&acc)[16][4], uint64_t a, uint64_t b,
                                        int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " RF_D64 ", %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : RF_ACC64(acc)
      : "l"(a), "l"(b), "r"(accumulate));
}
// acc[64 x 128] += A[64 x 16] (registers) * B[16 x 128], B N-major in shared
// memory (the transposed operand).
__device__ __forceinline__ void WgmmaRS(float (&acc)[16][4], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " RF_D64
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n"
      "}\n"
      : RF_ACC64(acc)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}
#undef RF_ACC4
#undef RF_ACC64
#undef RF_D64

// Byte offset of element (row, col) in a swizzled [ROWS][128] tile.
template <int ROWS>
__device__ __forceinline__ uint32_t SwzOffset(int row, int col) {
  return (col >> 6) * (ROWS * 128) + row * 128 + ((((col >> 3) & 7) ^ (row & 7)) << 4);
}

// Starts copying rows [row0, row0 + 128) of one head into a swizzled tile;
// rows outside [0, len) are zero-filled. Called by the 128 producer threads.
// Thread tid copies the 16-byte chunk tid % 16 of rows tid / 16 + 8 i: its
// rows share row % 8, hence the swizzled chunk, so source and destination
// step by constants (the producer runs on 40 registers; this path serves
// the tiles that cross a sequence end, TMA the others).
__device__ __forceinline__ void LoadTile(uint32_t s, const bf16* g, int64_t start, int row0,
                                         int len, int head, int heads, int tid) {
  const int r0 = tid >> 4, c = (tid & 15) * 8;
  const uint32_t dst = s + SwzOffset<128>(r0, c);
  const int64_t step = 8ll * heads * kD;
  const bf16* src = g + ((start + row0 + r0) * heads + head) * kD + c;
#pragma unroll 4
  for (int i = 0; i < 16; ++i) {
    const int row = row0 + r0 + 8 * i;
    const bool ok = row >= 0 && row < len;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst + i * 1024),
                 "l"(ok ? src + i * step : g), "r"(ok ? 16 : 0));
  }
}

// Waits for this thread's copies, makes them visible to the wgmma (async)
// proxy, and arrives on `bar`.
__device__ __forceinline__ void CopiesDone(uint32_t bar) {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  BarArrive(bar);
}

// One 64-column half of a tile (128 rows x 128 bytes, the same 128-byte
// swizzle) by TMA, completing on `bar`. Coordinates: column, head, row.
__device__ __forceinline__ void TmaLoadHalf(uint32_t dst, const CUtensorMap* map, int col,
                                            int head, int row, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(head), "r"(row), "r"(bar)
      : "memory");
}

// Fills the swizzled tile `s` with rows [row0, row0 + 128) of one head and
// arrives on `bar` (count: the 128 producer threads): one thread issues two
// TMA copies when every row lies inside the sequence, otherwise all threads
// copy with cp.async, zero-filling the rows outside.
__device__ __forceinline__ void FillTile(uint32_t s, const CUtensorMap* map, bool tma,
                                         const bf16* g, int64_t start, int row0, int len, int head,
                                         int heads, int tid, uint32_t bar) {
  if (tma && row0 + 128 <= len) {
    if (tid == 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                   "r"(kTileBytes)
                   : "memory");
      const int row = static_cast<int>(start + row0);
      TmaLoadHalf(s, map, 0, head, row, bar);
      TmaLoadHalf(s + 128 * 128, map, 64, head, row, bar);
    } else {
      BarArrive(bar);
    }
  } else {
    LoadTile(s, g, start, row0, len, head, heads, tid);
    CopiesDone(bar);
  }
}

__device__ __forceinline__ WorkItem ItemAt(const KernelParams& p, int w) {
  WorkItem it = p.items[w / p.heads];
  it.head = w % p.heads;
  it.bias_base += static_cast<int64_t>(it.head) * it.q_len * it.k_len;
  return it;
}

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

// Turns a warpgroup's 64 x 128 score tile (keys col0..col0 + 127) into
// probabilities in place: the mask (and bias), the scale, then either the
// online softmax step (running max m and sum l per row; corr receives the
// factor the output accumulated so far must be multiplied by) or the
// activation with corr = 1.
template <int A>
__device__ __forceinline__ void ScoresToProbs(const KernelParams& p, const WorkItem& it,
                                              float (&sc)[16][4], int row0, int col0, int t,
                                              float (&m)[2], float (&l)[2], float (&corr)[2]) {
  if (p.bias == nullptr && TileFull(p, it.q_len, it.k_len, it.tile_row, kRowsQ, col0, kRowsKv)) {
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (A == kActSoftmax) {
          sc[nt][e] *= p.scale * kLog2e;
        } else if constexpr (A == kActSilu) {
          sc[nt][e] = SiluOfHalf(sc[nt][e] * (0.5f * p.scale));
        } else {
          sc[nt][e] = Act<A>(sc[nt][e] * p.scale);
        }
      }
    }
  } else {
    int lo[2], hi[2];
    RowKeyRanges(p, it.q_len, it.k_len, row0, lo, hi);
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, j = col0 + nt * 8 + 2 * t + (e & 1);
        const bool vis = j >= lo[r] && j < hi[r];
        float x = sc[nt][e] * p.scale;
        if (p.bias != nullptr && vis) x += BiasAt(p, it, row0 + 8 * r, j);
        if constexpr (A == kActSoftmax) {
          sc[nt][e] = vis ? x * kLog2e : -INFINITY;
        } else {
          sc[nt][e] = vis ? Act<A>(x) : 0.f;
        }
      }
    }
  }
  corr[0] = corr[1] = 1.f;
  if constexpr (A == kActSoftmax) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) mx = fmaxf(mx, fmaxf(sc[nt][2 * r], sc[nt][2 * r + 1]));
      const float m_new = fmaxf(m[r], QuadMax(mx));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      corr[r] = Exp2(m[r] - m_use);
      m[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        sc[nt][2 * r] = Exp2(sc[nt][2 * r] - m_use);
        sc[nt][2 * r + 1] = Exp2(sc[nt][2 * r + 1] - m_use);
        sum += sc[nt][2 * r] + sc[nt][2 * r + 1];
      }
      l[r] = fmaf(l[r], corr[r], sum);
    }
  }
}

// S = Q K^T for one K/V stage: Q (this warpgroup's 64 rows) and K both
// from shared memory, eight k16 steps over the head dim.
__device__ __forceinline__ void IssueS(float (&sc)[16][4], uint32_t q_rows, uint32_t kb) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t off = (kk >> 2) * (128 * 128) + (kk & 3) * 32;
    WgmmaSS(sc, Desc(q_rows + off, 16, 1024), Desc(kb + off, 16, 1024), kk > 0);
  }
  WgCommit();
}

// The bf16 A fragments of P V from the fp32 probabilities.
__device__ __forceinline__ void PackProbs(const float (&sc)[16][4], uint32_t (&pa)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    pa[kk][0] = Pack(sc[2 * kk][0], sc[2 * kk][1]);
    pa[kk][1] = Pack(sc[2 * kk][2], sc[2 * kk][3]);
    pa[kk][2] = Pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
    pa[kk][3] = Pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
  }
}

// O += P V for one K/V stage: P (64 x 128 keys) from registers, V from
// shared memory. Keys [16 kk, 16 kk + 16) are two 8-row groups 1024 bytes
// apart; the two 64-column halves of V are 128 * 128 bytes apart.
__device__ __forceinline__ void IssuePv(float (&o)[16][4], const uint32_t (&pa)[8][4],
                                        uint32_t vb) {
#pragma unroll
  for (int kk = 0; kk < kRowsKv / 16; ++kk) {
    WgmmaRS(o, pa[kk], Desc(vb + kk * 16 * 128, 128 * 128, 1024));
  }
  WgCommit();
}

// Softmax: the thread's two rows' output scales (1 / sum) and their
// log-sum-exp, written by the quad's first thread. Other activations keep
// mul as it is.
template <int A>
__device__ __forceinline__ void FinishRows(const KernelParams& p, const WorkItem& it, int row0,
                                           int t, const float (&m)[2], const float (&l)[2],
                                           float (&mul)[2]) {
  if constexpr (A == kActSoftmax) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = QuadSum(l[r]);
      mul[r] = sum > 0.f ? 1.f / sum : 0.f;
      const int i = row0 + 8 * r;
      if (t == 0 && i < it.q_len) {
        p.lse[(it.q_start + i) * p.heads + it.head] =
            sum > 0.f ? (m[r] + log2f(sum)) * kLn2 : -INFINITY;
      }
    }
  }
}

// Writes a thread's two rows of O (the first `rows` of them: row, then
// 8 rows on), each scaled by its mul, as bf16.
__device__ __forceinline__ void StoreOut(const float (&o)[16][4], bf16* row, int rows, int heads,
                                         const float (&mul)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (r >= rows) break;
    bf16* out = row + static_cast<int64_t>(r) * 8 * heads * kD;
#pragma unroll
    for (int dt = 0; dt < 16; ++dt) {
      *reinterpret_cast<__nv_bfloat162*>(out + dt * 8) =
          __floats2bfloat162_rn(o[dt][2 * r] * mul[r], o[dt][2 * r + 1] * mul[r]);
    }
  }
}

template <int A, bool kOverlapOwnPv>
__global__ void __launch_bounds__(kCtaThreads, 1)
    WgmmaForwardKernel(const KernelParams p, const __grid_constant__ CUtensorMap q_map,
                       const __grid_constant__ CUtensorMap k_map,
                       const __grid_constant__ CUtensorMap v_map, bool tma) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw + 1023) & ~1023u;
  const uint32_t q_s = base;                    // two stages
  const uint32_t k_s = base + 2 * kTileBytes;   // two stages
  const uint32_t v_s = base + 4 * kTileBytes;   // two stages
  // Barriers, two stages each: K, V and Q landed (full) and released (empty).
  const uint32_t bars = base + 6 * kTileBytes;
  const uint32_t k_full = bars, v_full = bars + 16, q_full = bars + 32;
  const uint32_t k_empty = bars + 48, v_empty = bars + 64, q_empty = bars + 80;
  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
  const int total = p.num_items * p.heads;

  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) {
      for (uint32_t f : {k_full, v_full, q_full}) BarInit(f + 8 * s, kWgThreads);
      for (uint32_t e : {k_empty, v_empty, q_empty}) BarInit(e + 8 * s, 2 * kWgThreads);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 2) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    const bf16* q = static_cast<const bf16*>(p.q);
    const bf16* k = static_cast<const bf16*>(p.k);
    const bf16* v = static_cast<const bf16*>(p.v);
    int kv_iter = 0, q_iter = 0;
    for (int w = blockIdx.x; w < total; w += gridDim.x) {
      const WorkItem it = ItemAt(p, w);
      const int n_tiles = (it.inner_end - it.inner_begin + kRowsKv - 1) / kRowsKv;
      // Query tile j of the run goes to stage q_iter & 1, so it loads while
      // the consumers still work on the tile before; the item's K/V tiles
      // follow its first query tile and stay for the others.
      for (int j = 0; j < it.q_tiles; ++j, ++q_iter) {
        const int qs = q_iter & 1;
        BarWait(q_empty + 8 * qs, ((q_iter >> 1) & 1) ^ 1);
        FillTile(q_s + qs * kTileBytes, &q_map, tma, q, it.q_start, it.tile_row + j * kRowsQ,
                 it.q_len, it.head, p.heads, tid, q_full + 8 * qs);
        if (j > 0) continue;
        // K and V have barriers of their own: K_n is free once S_n is done,
        // V_n only after P_n V_n, which the consumers issue one step later.
        for (int n = 0; n < n_tiles; ++n, ++kv_iter) {
        const int s = kv_iter & 1, parity = ((kv_iter >> 1) & 1) ^ 1;
        const int row0 = it.inner_begin + n * kRowsKv;
        BarWait(k_empty + 8 * s, parity);
        FillTile(k_s + s * kTileBytes, &k_map, tma, k, it.k_start, row0, it.k_len, it.head,
                 p.heads, tid, k_full + 8 * s);
        BarWait(v_empty + 8 * s, parity);
        FillTile(v_s + s * kTileBytes, &v_map, tma, v, it.k_start, row0, it.k_len, it.head,
                 p.heads, tid, v_full + 8 * s);
        }
      }
    }
    return;
  }

  // Consumers. Per K/V tile n, in its turn, a warpgroup issues S_n = Q K_n^T
  // and O += P_{n-1} V_{n-1} back to back, passes the turn, and computes P_n
  // from S_n while the other warpgroup's GEMMs run (FlashAttention-3's
  // ping-pong with the intra-warpgroup overlap).
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  // kOverlapOwnPv: S_n turns into P_n while this warpgroup's own
  // P_{n-1} V_{n-1} still runs (softmax and SiLU; SiLU's one-tanh form fits
  // the registers). Without it the warpgroup waits for its P V first (GELU,
  // whose polynomial spills with O and P_{n-1} pinned by the running wgmma)
  // and overlaps only with the other warpgroup's GEMMs.
  // kChain (SiLU): the steps run across query tiles and items, a query
  // tile's last P V issued with the next tile's S_0 and its O stored after
  // that (KernelParams::wgmma_chain), so short K/V ranges need no GEMM step
  // of their own for the last P V: +9.5% on the short-K/V cross shape, none
  // on causal SiLU. Softmax and GELU keep one query tile at a time, which
  // measured 5% faster for them on H200 (bench/RESULTS.md, attention).
  constexpr bool kChain = A == kActSilu;
  const int c = wg;  // rows [64 c, 64 c + 64) of the query tile
  const int my_turn = 1 + c, other_turn = 2 - c;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int row_in_tile = c * 64 + warp * 16 + g;  // and + 8
  if (c == 1) TurnPass(p, 1);  // warpgroup 0 issues first
  if constexpr (kChain) {
    float o[16][4], sc[16][4], m[2], l[2], corr[2];
    uint32_t pa[8][4];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[i][e] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) pa[i][e] = 0u;
    }
    // The P V not yet issued, packed into one register (its state lives
    // across tiles, next to O, P and S): P in pa, V in stage pv_stage, its
    // full-barrier parity, and whether it releases V. Then where the query
    // tile it completes goes: this thread's first output row (the second is
    // 8 rows on), how many of the two lie in the sequence, and their scales.
    constexpr int kPvPending = 1, kPvRelease = 2, kPvStage = 4, kPvParity = 8;
    int pv = 0;
    bf16* out_row = nullptr;
    int out_rows = 0;
    float out_mul[2] = {1.f, 1.f};
    int kv_iter = 0, q_iter = 0;
    for (int w = blockIdx.x; w < total; w += gridDim.x) {
      WorkItem it = ItemAt(p, w);
      const int n_tiles = (it.inner_end - it.inner_begin + kRowsKv - 1) / kRowsKv;
      // Whether the query tile after this item's last one has K/V tiles, so
      // that the last P V can wait for its S_0.
      bool next_has_tiles = false;
      if (p.wgmma_chain && w + static_cast<int>(gridDim.x) < total) {
        const WorkItem& nx = p.items[(w + gridDim.x) / p.heads];
        next_has_tiles = nx.inner_end > nx.inner_begin;
      }
      // The query tiles of a grouped item share its resident K/V tiles (their
      // full barriers stay complete), which only the last one releases.
      const int kv_first = kv_iter;
      for (int j = 0; j < it.q_tiles; ++j, ++q_iter, it.tile_row += kRowsQ) {
        const bool release = j + 1 == it.q_tiles;
        kv_iter = kv_first;
        const int row0 = it.tile_row + row_in_tile;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.f;
        const int qs = q_iter & 1;
        const uint32_t q_tile = q_s + qs * kTileBytes;
        const uint32_t q_rows = q_tile + c * 64 * 128;  // this warpgroup's rows
        BarWait(q_full + 8 * qs, (q_iter >> 1) & 1);
        // The tile's last P V waits for the next query tile's S_0 if that has
        // K/V tiles; otherwise a last step issues it (with S on the query
        // tile itself, discarded).
        const bool flush = n_tiles > 0 && !(j + 1 < it.q_tiles ? p.wgmma_chain : next_has_tiles);
        const int steps = n_tiles + flush;
        for (int n = 0; n < steps; ++n) {
          // Step n: S_n with the pending P V (the previous K/V tile's, or at
          // n = 0 the previous query tile's last one). Without one pending
          // (n = 0 after a tile that flushed), the step still issues a P V,
          // on the query tile, whose result n = 0 discards. One code path
          // with no branch around any wgmma: two would merge versions of
          // O's registers with moves, and ptxas would serialize the wgmma
          // pipeline (C7520) and spill.
          const bool real = n < n_tiles;
          const int s = kv_iter & 1, parity = (kv_iter >> 1) & 1;
          const int col0 = it.inner_begin + n * kRowsKv;
          const bool pv_pending = pv & kPvPending;
          const int pv_stage = (pv & kPvStage) != 0;
          if (real) BarWait(k_full + 8 * s, parity);
          if (pv_pending) BarWait(v_full + 8 * pv_stage, (pv & kPvParity) != 0);
          const uint32_t kb = real ? k_s + s * kTileBytes : q_tile;
          const uint32_t vb = pv_pending ? v_s + pv_stage * kTileBytes : q_tile;
          TurnWait(p, my_turn);
          FenceRegs(pa);
          FenceRegs(o);
          WgFence();
          IssueS(sc, q_rows, kb);
          IssuePv(o, pa, vb);
          TurnPass(p, other_turn);
          if constexpr (kOverlapOwnPv) {
            WgWait1();
            FenceRegs(sc);
            if (real) {
              if (release) BarArrive(k_empty + 8 * s);
              ScoresToProbs<A>(p, it, sc, row0, col0, t, m, l, corr);
            }
          }
          WgWait0();
          FenceRegs(o);
          FenceRegs(pa);
          FenceRegs(sc);
          if (n + 1 == steps) BarArrive(q_empty + 8 * qs);
          if (pv_pending && (pv & kPvRelease)) BarArrive(v_empty + 8 * pv_stage);
          if constexpr (!kOverlapOwnPv) {
            if (real) {
              if (release) BarArrive(k_empty + 8 * s);
              ScoresToProbs<A>(p, it, sc, row0, col0, t, m, l, corr);
            }
          }
          if (real) PackProbs(sc, pa);
          if (n == 0) {
            // The previous query tile's O is complete (if its last P V waited).
            // Pinned here, so that its conversion is not hoisted into the
            // activation above (where it would hold 32 more registers).
            FenceRegs(pa);
            FenceRegs(o);
            if (pv_pending) StoreOut(o, out_row, out_rows, p.heads, out_mul);
#pragma unroll
            for (int dt = 0; dt < 16; ++dt) {
#pragma unroll
              for (int e = 0; e < 4; ++e) o[dt][e] = 0.f;
            }
          } else if constexpr (A == kActSoftmax) {
            if (real) {
#pragma unroll
              for (int dt = 0; dt < 16; ++dt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) o[dt][e] *= corr[e >> 1];
              }
            }
          }
          pv = real ? kPvPending | (release ? kPvRelease : 0) | (s ? kPvStage : 0) |
                          (parity ? kPvParity : 0)
                    : 0;
          if (real) ++kv_iter;
        }
        if (n_tiles == 0) BarArrive(q_empty + 8 * qs);

        // The tile's normalization (and log-sum-exp) are known now.
        out_row = static_cast<bf16*>(p.o) + ((it.q_start + row0) * p.heads + it.head) * kD + 2 * t;
        out_rows = (row0 < it.q_len) + (row0 + 8 < it.q_len);
        FinishRows<A>(p, it, row0, t, m, l, out_mul);
        // O is complete unless its last P V is pending (zero if no K/V).
        if (pv == 0) {
          StoreOut(o, out_row, out_rows, p.heads, out_mul);
#pragma unroll
          for (int dt = 0; dt < 16; ++dt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) o[dt][e] = 0.f;
          }
        }
      }
    }
  } else {
    // The loop of one query tile at a time: S_0 alone, S_n with
    // P_{n-1} V_{n-1}, the last P V alone, then O.
    int kv_iter = 0, q_iter = 0;
    for (int w = blockIdx.x; w < total; w += gridDim.x) {
      WorkItem it = ItemAt(p, w);
      const int n_tiles = (it.inner_end - it.inner_begin + kRowsKv - 1) / kRowsKv;
      // The query tiles of a grouped item share its resident K/V tiles (their
      // full barriers stay complete), which only the last one releases.
      const int kv_first = kv_iter;
      for (int j = 0; j < it.q_tiles; ++j, ++q_iter, it.tile_row += kRowsQ) {
        const bool release = j + 1 == it.q_tiles;
        kv_iter = kv_first;
        const int row0 = it.tile_row + row_in_tile;
        float o[16][4], sc[16][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, corr[2];
        uint32_t pa[8][4];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[i][e] = 0.f;
        }
        const int qs = q_iter & 1;
        BarWait(q_full + 8 * qs, (q_iter >> 1) & 1);
        const uint32_t q_rows = q_s + qs * kTileBytes + c * 64 * 128;  // this warpgroup's rows
        if (n_tiles > 0) {
          // Tile 0: S_0 alone.
          int s = kv_iter & 1;
          BarWait(k_full + 8 * s, (kv_iter >> 1) & 1);
          TurnWait(p, my_turn);
          WgFence();
          IssueS(sc, q_rows, k_s + s * kTileBytes);
          TurnPass(p, other_turn);
          WgWait0();
          FenceRegs(sc);
          if (release) BarArrive(k_empty + 8 * s);
          ScoresToProbs<A>(p, it, sc, row0, it.inner_begin, t, m, l, corr);
          PackProbs(sc, pa);
          for (int n = 1; n < n_tiles; ++n) {
            const int prev = s, prev_parity = (kv_iter >> 1) & 1;
            ++kv_iter;
            s = kv_iter & 1;
            BarWait(k_full + 8 * s, (kv_iter >> 1) & 1);
            BarWait(v_full + 8 * prev, prev_parity);
            TurnWait(p, my_turn);
            FenceRegs(pa);
            FenceRegs(o);
            WgFence();
            IssueS(sc, q_rows, k_s + s * kTileBytes);
            IssuePv(o, pa, v_s + prev * kTileBytes);
            TurnPass(p, other_turn);
            const int col0 = it.inner_begin + n * kRowsKv;
            if constexpr (kOverlapOwnPv) {
              WgWait1();
              FenceRegs(sc);
              if (release) BarArrive(k_empty + 8 * s);
              ScoresToProbs<A>(p, it, sc, row0, col0, t, m, l, corr);
            }
            WgWait0();
            FenceRegs(o);
            FenceRegs(pa);
            FenceRegs(sc);
            if (release) {
              if constexpr (!kOverlapOwnPv) BarArrive(k_empty + 8 * s);
              BarArrive(v_empty + 8 * prev);
            }
            if constexpr (!kOverlapOwnPv) ScoresToProbs<A>(p, it, sc, row0, col0, t, m, l, corr);
            if constexpr (A == kActSoftmax) {
#pragma unroll
              for (int dt = 0; dt < 16; ++dt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) o[dt][e] *= corr[e >> 1];
              }
            }
            PackProbs(sc, pa);
          }
          // The last tile's P V.
          BarWait(v_full + 8 * s, (kv_iter >> 1) & 1);
          TurnWait(p, my_turn);
          FenceRegs(pa);
          FenceRegs(o);
          WgFence();
          IssuePv(o, pa, v_s + s * kTileBytes);
          TurnPass(p, other_turn);
          WgWait0();
          FenceRegs(o);
          if (release) BarArrive(v_empty + 8 * s);
          ++kv_iter;
        }
        BarArrive(q_empty + 8 * qs);

        float mul[2] = {1.f, 1.f};
        FinishRows<A>(p, it, row0, t, m, l, mul);
        StoreRows<kD>(p.o, o, it.q_start, row0, it.q_len, it.head, p.heads, mul);
      }
    }
  }
  // Warpgroup 1 passed the turn once more than warpgroup 0 took it.
  if (c == 0) TurnWait(p, my_turn);
}

// The driver's tensor-map encoder, looked up once through the runtime (no
// link-time dependency on the driver library); null if unavailable.
PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A tensor map over a bf16 [rows, heads, 128] tensor whose boxes are the
// 64-column halves of 128-row tiles of one head, 128-byte swizzled (the
// layout LoadTile writes). False if the tensor does not qualify.
bool MakeTileMap(CUtensorMap* map, const void* base, int64_t rows, int heads) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr || rows <= 0 || rows > INT32_MAX ||
      reinterpret_cast<uintptr_t>(base) % 16 != 0) {
    return false;
  }
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kD), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {kD * 2, static_cast<cuuint64_t>(heads) * kD * 2};
  const cuuint32_t box[3] = {64, 1, 128};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides,
                box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int A, bool kOverlapOwnPv>
int LaunchWgmma(const KernelParams& p, int sms, void* stream) {
  const int total = p.num_items * p.heads;
  if (total == 0) return 0;
  CUtensorMap q_map{}, k_map{}, v_map{};
  const bool tma = p.wgmma_tma && MakeTileMap(&q_map, p.q, p.q_rows, p.heads) &&
                   MakeTileMap(&k_map, p.k, p.kv_rows, p.heads) &&
                   MakeTileMap(&v_map, p.v, p.kv_rows, p.heads);
  auto kernel = WgmmaForwardKernel<A, kOverlapOwnPv>;
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (e != cudaSuccess) return e;
  kernel<<<min(total, sms), kCtaThreads, kSmemBytes, static_cast<cudaStream_t>(stream)>>>(
      p, q_map, k_map, v_map, tma);
  return cudaGetLastError();
}

}  // namespace

bool WgmmaForwardSupports(const KernelParams& p) {
  return p.head_dim == kD && !p.rope;
}

int LaunchJaggedForwardWgmma(const KernelParams& p, int sms, void* stream) {
  if (p.activation == kActSoftmax) return LaunchWgmma<kActSoftmax, true>(p, sms, stream);
  if (p.activation == kActGelu) return LaunchWgmma<kActGelu, false>(p, sms, stream);
  if (p.wgmma_overlap) return LaunchWgmma<kActSilu, true>(p, sms, stream);
  return LaunchWgmma<kActSilu, false>(p, sms, stream);
}

}  // namespace recfleet::attention::cuda_impl
