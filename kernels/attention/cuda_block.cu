// BlockAttention: every 64-token block of a sequence attends only to itself,
// so each CTA solves one independent 64 x 64 problem of one head. Dedicated
// kernels: RoPE is applied while Q and K are loaded, the softmax is computed
// directly on the single score tile (no running max/sum rescaling), the
// backward recomputes the row statistics and rowsum(dO * O) from the tile
// instead of reading lse and a pre-pass result, keeps P and dS in shared
// memory (five GEMMs, none recomputed) and applies the inverse rotation of dQ
// and dK to the fp32 accumulators before the store. Outputs leave through
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
template <int D>
__device__ __forceinline__ void LoadQkRope(bf16* qs, bf16* ks, const WorkItem& it,
                                           const KernelParams& p) {
  constexpr int kHalfChunks = D / 16;  // 8-column chunk pairs per row
  constexpr int kIters = kTile * kHalfChunks / kThreads;
  const int c = (threadIdx.x % kHalfChunks) * 8;
  uint4 qa[kIters], qb[kIters], ka[kIters], kb[kIters];
#pragma unroll
  for (int n = 0; n < kIters; ++n) {
    const int row = it.tile_row + (threadIdx.x + n * kThreads) / kHalfChunks;
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
      const float pos = static_cast<float>(it.tile_row + (threadIdx.x + n * kThreads) / kHalfChunks);
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
    const int r = (threadIdx.x + n * kThreads) / kHalfChunks;
    *reinterpret_cast<uint4*>(qs + Swz<D>(r, c)) = qa[n];
    *reinterpret_cast<uint4*>(qs + Swz<D>(r, c + D / 2)) = qb[n];
    *reinterpret_cast<uint4*>(ks + Swz<D>(r, c)) = ka[n];
    *reinterpret_cast<uint4*>(ks + Swz<D>(r, c + D / 2)) = kb[n];
  }
}

// The scores scale * <q_i, k_j> + bias of a warp's 16 query rows of the
// block (row_base = the first), -inf where the query or the key lies past
// the sequence end.
__device__ __forceinline__ void BlockScores(float (&s)[8][4], const KernelParams& p,
                                            const WorkItem& it, int row_base) {
  const int t = threadIdx.x & 3, len = it.q_len;
  const bool full = it.tile_row + kTile <= len;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = row_base + (e >> 1) * 8, j = it.tile_row + nt * 8 + 2 * t + (e & 1);
      const bool vis = full || (i < len && j < len);
      float x = s[nt][e] * p.scale;
      if (p.bias != nullptr && vis) x += BiasAt(p, it, i, j);
      s[nt][e] = vis ? x : -INFINITY;
    }
  }
}

// dLoss/dx from dLoss/d(rotated x) on a warp's fp32 accumulator rows: the
// transpose of the rotation, applied in registers (both halves of a pair
// live in the same thread).
template <int D>
__device__ __forceinline__ void RopeInverse(float (&acc)[D / 8][4], int row_base,
                                            const KernelParams& p) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int dt = 0; dt < D / 16; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float cs, sn;
      RopeCosSin(row_base + (e >> 1) * 8, dt * 8 + 2 * t + (e & 1), D, p.log2_theta, cs, sn);
      const float a = acc[dt][e], b = acc[dt + D / 16][e];
      acc[dt][e] = a * cs + b * sn;
      acc[dt + D / 16][e] = b * cs - a * sn;
    }
  }
}

// Loads one block's tiles of this CTA's head (RoPE applied to Q and K; dO
// too for the backward) and waits for all of them.
template <int D, bool kWithDout>
__device__ __forceinline__ void LoadBlock(bf16* qs, bf16* ks, bf16* vs, bf16* dos,
                                          const WorkItem& it, const KernelParams& p) {
  LoadTileAsync<D, kTile>(vs, static_cast<const bf16*>(p.v), it.k_start, it.tile_row, it.q_len,
                          it.head, p.heads);
  if constexpr (kWithDout) {
    LoadTileAsync<D, kTile>(dos, static_cast<const bf16*>(p.dout), it.q_start, it.tile_row,
                            it.q_len, it.head, p.heads);
  }
  CpAsyncCommit();
  LoadQkRope<D>(qs, ks, it, p);
  CpAsyncWait<0>();
  __syncthreads();
}

// Memory-bound (each block's bytes are used for one 64 x 64 problem): capped
// at 128 registers so that four CTAs per SM keep enough loads in flight.
template <int D, int A>
__global__ void __launch_bounds__(kThreads, 4) BlockForwardKernel(const KernelParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + kTile * D;
  bf16* vs = ks + kTile * D;
  const WorkItem it = LoadItem(p);
  LoadBlock<D, false>(qs, ks, vs, nullptr, it, p);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int len = it.q_len;
  float s[8][4];
  Zero(s);
  GemmABtSmem<D, 8>(s, qs, warp * 16, ks, 0);
  const int row_base = it.tile_row + warp * 16 + g;
  BlockScores(s, p, it, row_base);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (A == kActSoftmax) {
        s[nt][e] *= kLog2e;
      } else {
        s[nt][e] = s[nt][e] == -INFINITY ? 0.f : Act<A>(s[nt][e]);
      }
    }
  }
  float mul[2] = {1.f, 1.f};
  if constexpr (A == kActSoftmax) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      mx = QuadMax(mx);
      const float m_use = mx == -INFINITY ? 0.f : mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        s[nt][2 * r] = Exp2(s[nt][2 * r] - m_use);
        s[nt][2 * r + 1] = Exp2(s[nt][2 * r + 1] - m_use);
        sum += s[nt][2 * r] + s[nt][2 * r + 1];
      }
      sum = QuadSum(sum);
      mul[r] = sum > 0.f ? 1.f / sum : 0.f;
      const int i = row_base + 8 * r;
      if (t == 0 && i < len) {
        p.lse[(it.q_start + i) * p.heads + it.head] =
            sum > 0.f ? (m_use + log2f(sum)) * kLn2 : -INFINITY;
      }
    }
  }
  float o[D / 8][4];
  Zero(o);
  GemmPB<D, 8>(o, s, vs, 0);
  // The warp's own rows of Q (read by no other warp) stage its output.
  StoreRowsStaged<D>(p.o, o, qs, warp * 16, it.q_start, it.tile_row + warp * 16, len, it.head,
                     p.heads, mul);
}

// acc[16 x D] += A^T * B over K rows: A a swizzled row-major [K][kTile]
// tile read transposed (its columns a_col0 .. a_col0 + 16 are the product's
// rows), B a swizzled row-major [K][D] tile.
template <int D, int K>
__device__ __forceinline__ void GemmAtB(float (&acc)[D / 8][4], const bf16* As, int a_col0,
                                        const bf16* Bs) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t a[4];
    Ldsm4T(a, As + Swz<kTile>(kk * 16 + (lane & 7) + (lane >> 4) * 8,
                              a_col0 + ((lane >> 3) & 1) * 8));
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      uint32_t b[4];
      Ldsm4T(b, Bs + Swz<D>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                            dn * 16 + (lane >> 4) * 8));
      Mma(acc[2 * dn], a, b[0], b[1]);
      Mma(acc[2 * dn + 1], a, b[2], b[3]);
    }
  }
}

// Shared memory of the backward, in elements: Q, K, dO, then V, whose slot
// P and dS (two [64][64] tiles) take over once S and dP are formed.
template <int D>
constexpr int BlockBackwardSmemElems() {
  return 3 * kTile * D + (kTile * D > 2 * kTile * kTile ? kTile * D : 2 * kTile * kTile);
}

// Phase 1, warp = 16 queries: S and dP, the probabilities from the whole
// score row, dS; P and dS to shared memory, dQ = dS K. Phase 2, warp = 16
// keys: dV = P^T dO and dK = dS^T Q from the shared P and dS. Three CTAs
// per SM (64 KiB of shared memory each at d = 128, at most 168 registers).
template <int D, int A>
__global__ void __launch_bounds__(kThreads, 3) BlockBackwardKernel(const KernelParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + kTile * D;
  bf16* dos = ks + kTile * D;
  bf16* vs = dos + kTile * D;
  bf16* ps = vs;                    // P [query][key], after every warp's dP
  bf16* dss = vs + kTile * kTile;   // scale * dS [query][key]
  const WorkItem it = LoadItem(p);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int len = it.q_len;
  LoadBlock<D, true>(qs, ks, vs, dos, it, p);
  const float one[2] = {1.f, 1.f};
  const int row_base = it.tile_row + warp * 16 + g;

  float s[8][4], dp[8][4];
  Zero(s);
  Zero(dp);
  GemmABtSmem<D, 8>(s, qs, warp * 16, ks, 0);
  GemmABtSmem<D, 8>(dp, dos, warp * 16, vs, 0);
  BlockScores(s, p, it, row_base);
  if constexpr (A == kActSoftmax) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      }
      mx = QuadMax(mx) * kLog2e;
      const float m_use = mx == -INFINITY ? 0.f : mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          s[nt][2 * r + c] = Exp2(s[nt][2 * r + c] * kLog2e - m_use);
          sum += s[nt][2 * r + c];
        }
      }
      sum = QuadSum(sum);
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      float dsum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          s[nt][2 * r + c] *= inv;
          dsum += s[nt][2 * r + c] * dp[nt][2 * r + c];
        }
      }
      dsum = QuadSum(dsum);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          dp[nt][2 * r + c] = s[nt][2 * r + c] * (dp[nt][2 * r + c] - dsum);
        }
      }
    }
  } else {
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
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
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = row_base + (e >> 1) * 8, j = it.tile_row + nt * 8 + 2 * t + (e & 1);
      if (p.dbias != nullptr && i < len && j < len) StoreBias(p, it, i, j, dp[nt][e]);
      dp[nt][e] *= p.scale;
    }
  }
  __syncthreads();  // every warp's dP GEMM has read V: P and dS take its slot
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int off = Swz<kTile>(warp * 16 + g + 8 * r, nt * 8 + 2 * t);
      *reinterpret_cast<__nv_bfloat162*>(ps + off) =
          __floats2bfloat162_rn(s[nt][2 * r], s[nt][2 * r + 1]);
      *reinterpret_cast<__nv_bfloat162*>(dss + off) =
          __floats2bfloat162_rn(dp[nt][2 * r], dp[nt][2 * r + 1]);
    }
  }
  float acc[D / 8][4];
  Zero(acc);
  GemmPB<D, 8>(acc, dp, ks, 0);
  if (p.rope) RopeInverse<D>(acc, row_base, p);
  __syncthreads();  // P and dS complete; every warp is done with K, whose rows now stage stores
  StoreRowsStaged<D>(p.dq, acc, ks, warp * 16, it.q_start, it.tile_row + warp * 16, len, it.head,
                     p.heads, one);

  Zero(acc);
  GemmAtB<D, kTile>(acc, ps, warp * 16, dos);
  StoreRowsStaged<D>(p.dv, acc, ks, warp * 16, it.k_start, it.tile_row + warp * 16, len, it.head,
                     p.heads, one);
  Zero(acc);
  GemmAtB<D, kTile>(acc, dss, warp * 16, qs);
  if (p.rope) RopeInverse<D>(acc, row_base, p);
  StoreRowsStaged<D>(p.dk, acc, ks, warp * 16, it.k_start, it.tile_row + warp * 16, len, it.head,
                     p.heads, one);
}

}  // namespace

int LaunchBlockForward(const KernelParams& p, void* stream) {
  return DispatchKernel(p, [&](auto d, auto a) {
    constexpr int D = decltype(d)::value, A = decltype(a)::value;
    return Launch(BlockForwardKernel<D, A>, p.num_items, 3 * kTile * D * 2, p, stream);
  });
}

int LaunchBlockBackward(const KernelParams& p, void* stream) {
  return DispatchKernel(p, [&](auto d, auto a) {
    constexpr int D = decltype(d)::value, A = decltype(a)::value;
    return Launch(BlockBackwardKernel<D, A>, p.num_items, BlockBackwardSmemElems<D>() * 2, p,
                  stream);
  });
}

}  // namespace recfleet::attention::cuda_impl
