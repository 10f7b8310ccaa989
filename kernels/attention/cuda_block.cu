// BlockAttention: every 64-token block of a sequence attends only to itself,
// so each CTA solves one independent 64 x 64 problem of one head. Dedicated
// kernels: RoPE is applied while Q and K are loaded, the softmax is computed
// directly on the single score tile (no running max/sum rescaling), the
// backward recomputes the row statistics and rowsum(dO * O) from the tile
// instead of reading lse and a pre-pass result, keeps P and dS in shared
// memory (five GEMMs, none recomputed) and applies the inverse rotation of dQ
// and dK to the fp32 accumulators before the store. Eight warps per CTA, two
// per 16 rows, each with half of the keys or columns. Outputs leave through
// shared memory as 16-byte row segments. The work is memory-bound
// (bench/RESULTS.md has the layout's roofline and what was measured).

#include <cmath>

#include "kernels/attention/cuda_common.cuh"

namespace recfleet::attention::cuda_impl {
namespace {

constexpr int kTile = kTileRows;

// Loads rows [tile_row, tile_row + 64) of one head of q and of k into
// swizzled tiles, rotating each (c, c + D/2) pair by RoPE at position = row
// when p.rope. Every global load is issued before any arithmetic (the loads'
// latency overlaps), a thread keeps the same columns in every row it loads
// (one inverse frequency each), and each angle serves both q and k.
template <int D, int NT>
__device__ __forceinline__ void LoadQkRope(bf16* qs, bf16* ks, const WorkItem& it,
                                           const KernelParams& p) {
  constexpr int kHalfChunks = D / 16;  // 8-column chunk pairs per row
  constexpr int kIters = kTile * kHalfChunks / NT;
  const int c = (threadIdx.x % kHalfChunks) * 8;
  uint4 qa[kIters], qb[kIters], ka[kIters], kb[kIters];
#pragma unroll
  for (int n = 0; n < kIters; ++n) {
    const int row = it.tile_row + (threadIdx.x + n * NT) / kHalfChunks;
    qa[n] = qb[n] = ka[n] = kb[n] = make_uint4(0, 0, 0, 0);
    if (row < it.q_len) {
      const bf16* q = static_cast<const bf16*>(p.q) + ((it.q_start + row) * p.heads + it.head) * D;
      const bf16* k = static_cast<const bf16*>(p.k) + ((it.k_start + row) * p.heads + it.head) * D;
      qa[n] = *reinterpret_cast<const uint4*>(q + c);
      qb[n] = *reinterpret_cast<const uint4*>(q + c + D / 2);
      ka[n] = *reinterpret_cast<const uint4*>(k + c);
      kb[n] = *reinterpret_cast<const uint4*>(k + c + D / 2);
    }
  }
  if (p.rope) {
    float inv_freq[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) inv_freq[e] = RopeInvFreq(c + e, D, p.log2_theta);
#pragma unroll
    for (int n = 0; n < kIters; ++n) {
      const float pos = static_cast<float>(it.tile_row + (threadIdx.x + n * NT) / kHalfChunks);
      bf16* qae = reinterpret_cast<bf16*>(&qa[n]);
      bf16* qbe = reinterpret_cast<bf16*>(&qb[n]);
      bf16* kae = reinterpret_cast<bf16*>(&ka[n]);
      bf16* kbe = reinterpret_cast<bf16*>(&kb[n]);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float cs, sn;
        RopeCosSinOf(pos * inv_freq[e], cs, sn);
        float x = __bfloat162float(qae[e]), y = __bfloat162float(qbe[e]);
        qae[e] = __float2bfloat16(x * cs - y * sn);
        qbe[e] = __float2bfloat16(y * cs + x * sn);
        x = __bfloat162float(kae[e]);
        y = __bfloat162float(kbe[e]);
        kae[e] = __float2bfloat16(x * cs - y * sn);
        kbe[e] = __float2bfloat16(y * cs + x * sn);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < kIters; ++n) {
    const int r = (threadIdx.x + n * NT) / kHalfChunks;
    *reinterpret_cast<uint4*>(qs + Swz<D>(r, c)) = qa[n];
    *reinterpret_cast<uint4*>(qs + Swz<D>(r, c + D / 2)) = qb[n];
    *reinterpret_cast<uint4*>(ks + Swz<D>(r, c)) = ka[n];
    *reinterpret_cast<uint4*>(ks + Swz<D>(r, c + D / 2)) = kb[n];
  }
}

// The scores scale * <q_i, k_j> + bias of a warp's 16 query rows of the
// block (row_base = the first) and 8N keys from key0 (within the block) on,
// -inf where the query or the key lies past the sequence end.
template <int N>
__device__ __forceinline__ void BlockScores(float (&s)[N][4], const KernelParams& p,
                                            const WorkItem& it, int row_base, int key0 = 0) {
  const int t = threadIdx.x & 3, len = it.q_len;
  const bool full = it.tile_row + kTile <= len;
#pragma unroll
  for (int nt = 0; nt < N; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = row_base + (e >> 1) * 8, j = it.tile_row + key0 + nt * 8 + 2 * t + (e & 1);
      const bool vis = full || (i < len && j < len);
      float x = s[nt][e] * p.scale;
      if (p.bias != nullptr && vis) x += BiasAt(p, it, i, j);
      s[nt][e] = vis ? x : -INFINITY;
    }
  }
}

// dLoss/dx from dLoss/d(rotated x) on a warp's fp32 accumulator rows of NC
// columns, col0 .. col0 + NC / 2 and the same D / 2 further on: the
// transpose of the rotation, applied in registers (both halves of a pair
// live in the same thread).
template <int D, int NC = D>
__device__ __forceinline__ void RopeInverse(float (&acc)[NC / 8][4], int row_base,
                                            const KernelParams& p, int col0 = 0) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int dt = 0; dt < NC / 16; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float cs, sn;
      RopeCosSin(row_base + (e >> 1) * 8, col0 + dt * 8 + 2 * t + (e & 1), D, p.log2_theta, cs,
                 sn);
      const float a = acc[dt][e], b = acc[dt + NC / 16][e];
      acc[dt][e] = a * cs + b * sn;
      acc[dt + NC / 16][e] = b * cs - a * sn;
    }
  }
}

// Loads one block's tiles of this CTA's head (RoPE applied to Q and K; dO
// too for the backward) and waits for all of them.
template <int D, bool kWithDout, int NT = kThreads>
__device__ __forceinline__ void LoadBlock(bf16* qs, bf16* ks, bf16* vs, bf16* dos,
                                          const WorkItem& it, const KernelParams& p) {
  LoadTileAsync<D, kTile, NT>(vs, static_cast<const bf16*>(p.v), it.k_start, it.tile_row,
                              it.q_len, it.head, p.heads);
  if constexpr (kWithDout) {
    LoadTileAsync<D, kTile, NT>(dos, static_cast<const bf16*>(p.dout), it.q_start, it.tile_row,
                                it.q_len, it.head, p.heads);
  }
  CpAsyncCommit();
  LoadQkRope<D, NT>(qs, ks, it, p);
  CpAsyncWait<0>();
  __syncthreads();
}

// Eight warps per block: warp w owns query rows 16 (w % 4) .. + 16 and, as
// half h = w / 4, keys 32 h .. + 32 of the scores and output columns
// h D / 2 .. + D / 2 of O. Halving each warp's share of the block halves the
// dependent chain (loads, RoPE, QK^T, softmax, P V, store) that one block
// costs, and with four CTAs per SM twice as many warps hide it. The halves
// of a row meet twice in shared memory: the row max before the
// exponentials, the row sum (and all of P) before P V.
constexpr int kWide = 2 * kThreads;

// Shared memory of the forward in bytes: Q (then P, [64][64] bf16), K (then
// the output staging), V, and the halves' row maxima and sums.
template <int D>
constexpr int BlockForwardSmemBytes() {
  return 3 * kTile * D * 2 + 4 * kTile * 4;
}

// acc[16 x 8N] += A * B[0 .. kTile, cols]: A rows a0 .. a0 + 16 of a
// swizzled row-major [.][kTile] tile, or with kAt its columns a0 .. a0 + 16
// read transposed; B a swizzled row-major [kTile][D] tile whose columns are
// c0 .. c0 + 4N and c1 .. c1 + 4N.
template <int D, int N, bool kAt>
__device__ __forceinline__ void GemmSmemAB(float (&acc)[N][4], const bf16* As, int a0,
                                           const bf16* Bs, int c0, int c1) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    uint32_t a[4];
    if constexpr (kAt) {
      Ldsm4T(a, As + Swz<kTile>(kk * 16 + (lane & 7) + (lane >> 4) * 8,
                                a0 + ((lane >> 3) & 1) * 8));
    } else {
      Ldsm4(a, As + Swz<kTile>(a0 + (lane & 15), kk * 16 + (lane >> 4) * 8));
    }
#pragma unroll
    for (int dn = 0; dn < N / 2; ++dn) {
      const int col = dn < N / 4 ? c0 + dn * 16 : c1 + (dn - N / 4) * 16;
      uint32_t b[4];
      Ldsm4T(b, Bs + Swz<D>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                            col + (lane >> 4) * 8));
      Mma(acc[2 * dn], a, b[0], b[1]);
      Mma(acc[2 * dn + 1], a, b[2], b[3]);
    }
  }
}

// StoreRowsStaged (factors 1) of a warp's [16 x D / 2] accumulator whose
// columns are c0 .. c0 + D / 4 and c0 + D / 2 .. c0 + 3 D / 4.
template <int D>
__device__ __forceinline__ void StoreHalfCols(void* dst, float (&acc)[D / 16][4], bf16* stage,
                                              int stage_row, int64_t start, int row0, int len,
                                              int head, int heads, int c0) {
  const float one[2] = {1.f, 1.f};
  auto& parts = reinterpret_cast<float(&)[2][D / 32][4]>(acc);
  StoreRowsStaged<D, D / 4>(dst, parts[0], stage, stage_row, start, row0, len, head, heads, one,
                            c0);
  StoreRowsStaged<D, D / 4>(dst, parts[1], stage, stage_row, start, row0, len, head, heads, one,
                            c0 + D / 2);
}

// Memory-bound (each block's bytes are used for one 64 x 64 problem): at
// most 64 registers, so that four CTAs of eight warps share an SM.
template <int D, int A>
__global__ void __launch_bounds__(kWide, 4) BlockForwardKernel(const KernelParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + kTile * D;
  bf16* vs = ks + kTile * D;
  bf16* ps = qs;  // P [query][key], once every warp's QK^T is done
  float* row_max = reinterpret_cast<float*>(vs + kTile * D);  // [half][row]
  float* row_sum = row_max + 2 * kTile;                       // [half][row]
  const WorkItem it = LoadItem(p);
  LoadBlock<D, false, kWide>(qs, ks, vs, nullptr, it, p);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int rw = warp & 3, half = warp >> 2, len = it.q_len;
  float s[4][4];
  Zero(s);
  GemmABtSmem<D, 4>(s, qs, rw * 16, ks, half * 32);
  const int row_base = it.tile_row + rw * 16 + g;
  BlockScores(s, p, it, row_base, half * 32);
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (A == kActSoftmax) {
        s[nt][e] *= kLog2e;
      } else {
        s[nt][e] = s[nt][e] == -INFINITY ? 0.f : Act<A>(s[nt][e]);
      }
    }
  }
  if constexpr (A == kActSoftmax) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      mx = QuadMax(mx);
      if (t == 0) row_max[half * kTile + rw * 16 + g + 8 * r] = mx;
    }
  }
  __syncthreads();  // the row maxima are out; every warp is done with Q and K
  float mul[2] = {1.f, 1.f};
  if constexpr (A == kActSoftmax) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = rw * 16 + g + 8 * r;
      const float mx = fmaxf(row_max[row], row_max[kTile + row]);
      const float m_use = mx == -INFINITY ? 0.f : mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        s[nt][2 * r] = Exp2(s[nt][2 * r] - m_use);
        s[nt][2 * r + 1] = Exp2(s[nt][2 * r + 1] - m_use);
        sum += s[nt][2 * r] + s[nt][2 * r + 1];
      }
      sum = QuadSum(sum);
      if (t == 0) row_sum[half * kTile + row] = sum;
      mul[r] = m_use;  // kept until the sums meet
    }
  }
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      *reinterpret_cast<__nv_bfloat162*>(ps + Swz<kTile>(rw * 16 + g + 8 * r,
                                                         half * 32 + nt * 8 + 2 * t)) =
          __floats2bfloat162_rn(s[nt][2 * r], s[nt][2 * r + 1]);
    }
  }
  __syncthreads();  // P and the row sums complete
  if constexpr (A == kActSoftmax) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = rw * 16 + g + 8 * r;
      const float sum = row_sum[row] + row_sum[kTile + row], m_use = mul[r];
      mul[r] = sum > 0.f ? 1.f / sum : 0.f;
      const int i = row_base + 8 * r;
      if (half == 0 && t == 0 && i < len) {
        p.lse[(it.q_start + i) * p.heads + it.head] =
            sum > 0.f ? (m_use + log2f(sum)) * kLn2 : -INFINITY;
      }
    }
  }
  float o[D / 16][4];
  Zero(o);
  GemmSmemAB<D, D / 16, false>(o, ps, rw * 16, vs, half * (D / 2), half * (D / 2) + D / 4);
  // The warp's own rows and columns of K (no warp reads K any more) stage
  // its output.
  StoreRowsStaged<D, D / 2>(p.o, o, ks, rw * 16, it.q_start, it.tile_row + rw * 16, len, it.head,
                            p.heads, mul, half * (D / 2));
}

// Shared memory of the backward in bytes: Q, K, dO, then V, whose slot P
// and dS (two [64][64] tiles) take over once S and dP are formed, and the
// halves' row statistics.
template <int D>
constexpr int BlockBackwardSmemBytes() {
  return (3 * kTile * D + (kTile * D > 2 * kTile * kTile ? kTile * D : 2 * kTile * kTile)) * 2 +
         3 * 2 * kTile * 4;
}

// Eight warps as in the forward. Phase 1, warp = 16 queries x 32 keys: S
// and dP; softmax from the halves' partial row statistics (max, sum of the
// exponentials and of their products with dP, each against its own max),
// exchanged once; P and dS to shared memory. Phase 2, warp = 16 rows x half
// of the columns: dQ = dS K, dV = P^T dO and dK = dS^T Q, a warp's columns
// chosen so that both columns of every RoPE pair are its own. Three CTAs
// per SM (64 KiB of shared memory each at d = 128, at most 80 registers).
template <int D, int A>
__global__ void __launch_bounds__(kWide, 3) BlockBackwardKernel(const KernelParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + kTile * D;
  bf16* dos = ks + kTile * D;
  bf16* vs = dos + kTile * D;
  bf16* ps = vs;                   // P [query][key], after every warp's dP
  bf16* dss = vs + kTile * kTile;  // scale * dS [query][key]
  float* stats = reinterpret_cast<float*>(smem + BlockBackwardSmemBytes<D>() - 3 * 2 * kTile * 4);
  const WorkItem it = LoadItem(p);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int rw = warp & 3, half = warp >> 2, len = it.q_len;
  LoadBlock<D, true, kWide>(qs, ks, vs, dos, it, p);
  const int row_base = it.tile_row + rw * 16 + g;

  float s[4][4], dp[4][4];
  Zero(s);
  Zero(dp);
  GemmABtSmem<D, 4>(s, qs, rw * 16, ks, half * 32);
  GemmABtSmem<D, 4>(dp, dos, rw * 16, vs, half * 32);
  BlockScores(s, p, it, row_base, half * 32);
  // This half's row statistics, each against its own max: [what][half][row].
  float* row_max = stats;
  float* row_sum = stats + 2 * kTile;
  float* row_dot = stats + 4 * kTile;
  if constexpr (A == kActSoftmax) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      mx = QuadMax(mx) * kLog2e;
      const float m_use = mx == -INFINITY ? 0.f : mx;
      float sum = 0.f, dot = 0.f;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          s[nt][2 * r + c] = Exp2(s[nt][2 * r + c] * kLog2e - m_use);
          sum += s[nt][2 * r + c];
          dot += s[nt][2 * r + c] * dp[nt][2 * r + c];
        }
      }
      sum = QuadSum(sum);
      dot = QuadSum(dot);
      if (t == 0) {
        const int row = half * kTile + rw * 16 + g + 8 * r;
        row_max[row] = mx;
        row_sum[row] = sum;
        row_dot[row] = dot;
      }
    }
  }
  __syncthreads();  // the statistics are out; every warp's dP GEMM has read V
  if constexpr (A == kActSoftmax) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = rw * 16 + g + 8 * r;
      const float m0 = row_max[row], m1 = row_max[kTile + row], m = fmaxf(m0, m1);
      // exp2(this half's max - the row's max) scales a half's exponentials.
      const float f0 = m0 == -INFINITY ? 0.f : Exp2(m0 - m);
      const float f1 = m1 == -INFINITY ? 0.f : Exp2(m1 - m);
      const float sum = row_sum[row] * f0 + row_sum[kTile + row] * f1;
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      const float dsum = (row_dot[row] * f0 + row_dot[kTile + row] * f1) * inv;
      const float mul = (half == 0 ? f0 : f1) * inv;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          s[nt][2 * r + c] *= mul;
          dp[nt][2 * r + c] = s[nt][2 * r + c] * (dp[nt][2 * r + c] - dsum);
        }
      }
    }
  } else {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float y = 0.f, dy = 0.f;
        if (s[nt][e] != -INFINITY) ActAndGrad<A>(s[nt][e], y, dy);
        s[nt][e] = y;
        dp[nt][e] *= dy;
      }
    }
  }
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = row_base + (e >> 1) * 8, j = it.tile_row + half * 32 + nt * 8 + 2 * t + (e & 1);
      if (p.dbias != nullptr && i < len && j < len) StoreBias(p, it, i, j, dp[nt][e]);
      dp[nt][e] *= p.scale;
    }
  }
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int off = Swz<kTile>(rw * 16 + g + 8 * r, half * 32 + nt * 8 + 2 * t);
      *reinterpret_cast<__nv_bfloat162*>(ps + off) =
          __floats2bfloat162_rn(s[nt][2 * r], s[nt][2 * r + 1]);
      *reinterpret_cast<__nv_bfloat162*>(dss + off) =
          __floats2bfloat162_rn(dp[nt][2 * r], dp[nt][2 * r + 1]);
    }
  }
  __syncthreads();  // P and dS complete
  // This warp's columns: D / 4 from c0 and D / 4 from c0 + D / 2.
  const int c0 = half * (D / 4);
  float acc[D / 16][4];
  Zero(acc);
  GemmSmemAB<D, D / 16, false>(acc, dss, rw * 16, ks, c0, c0 + D / 2);
  if (p.rope) RopeInverse<D, D / 2>(acc, row_base, p, c0);
  __syncthreads();  // every warp is done with K, whose rows now stage stores
  StoreHalfCols<D>(p.dq, acc, ks, rw * 16, it.q_start, it.tile_row + rw * 16, len, it.head,
                   p.heads, c0);
  Zero(acc);
  GemmSmemAB<D, D / 16, true>(acc, ps, rw * 16, dos, c0, c0 + D / 2);
  StoreHalfCols<D>(p.dv, acc, ks, rw * 16, it.k_start, it.tile_row + rw * 16, len, it.head,
                   p.heads, c0);
  Zero(acc);
  GemmSmemAB<D, D / 16, true>(acc, dss, rw * 16, qs, c0, c0 + D / 2);
  if (p.rope) RopeInverse<D, D / 2>(acc, row_base, p, c0);
  StoreHalfCols<D>(p.dk, acc, ks, rw * 16, it.k_start, it.tile_row + rw * 16, len, it.head,
                   p.heads, c0);
}

}  // namespace

int LaunchBlockForward(const KernelParams& p, void* stream) {
  return DispatchKernel(p, [&](auto d, auto a) {
    constexpr int D = decltype(d)::value, A = decltype(a)::value;
    return Launch<kWide>(BlockForwardKernel<D, A>, p.num_items, BlockForwardSmemBytes<D>(), p,
                         stream);
  });
}

int LaunchBlockBackward(const KernelParams& p, void* stream) {
  return DispatchKernel(p, [&](auto d, auto a) {
    constexpr int D = decltype(d)::value, A = decltype(a)::value;
    return Launch<kWide>(BlockBackwardKernel<D, A>, p.num_items, BlockBackwardSmemBytes<D>(), p,
                         stream);
  });
}

}  // namespace recfleet::attention::cuda_impl
