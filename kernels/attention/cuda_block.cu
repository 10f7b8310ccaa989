// BlockAttention: every 64-token block of a sequence attends only to itself,
// so each CTA solves one independent 64 x 64 problem of one head. Dedicated
// kernels: RoPE is applied while Q and K are loaded, the softmax is computed
// directly on the single score tile (no running max/sum rescaling), the
// backward recomputes the row statistics and rowsum(dO * O) from the tile
// instead of reading lse and a pre-pass result, and the inverse rotation of
// dQ and dK happens on the fp32 accumulators before the store.

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

// Memory-bound (each block's bytes are used for one 64 x 64 problem): capped
// at 128 registers so that four CTAs per SM keep enough loads in flight.
template <int D, int A>
__global__ void __launch_bounds__(kThreads, 4) BlockForwardKernel(const KernelParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + kTile * D;
  bf16* vs = ks + kTile * D;
  const WorkItem it = LoadItem(p);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int len = it.q_len;
  LoadTileAsync<D, kTile>(vs, static_cast<const bf16*>(p.v), it.k_start, it.tile_row, len,
                          it.head, p.heads);
  CpAsyncCommit();
  LoadQkRope<D>(qs, ks, it, p);
  CpAsyncWait<0>();
  __syncthreads();

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
  StoreRows<D>(p.o, o, it.q_start, row_base, len, it.head, p.heads, mul);
}

template <int D, int A>
__global__ void __launch_bounds__(kThreads) BlockBackwardKernel(const KernelParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + kTile * D;
  bf16* vs = ks + kTile * D;
  bf16* dos = vs + kTile * D;
  float* lse_s = reinterpret_cast<float*>(dos + kTile * D);  // log2 domain
  float* dsum_s = lse_s + kTile;
  const WorkItem it = LoadItem(p);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int len = it.q_len;
  LoadTileAsync<D, kTile>(vs, static_cast<const bf16*>(p.v), it.k_start, it.tile_row, len,
                          it.head, p.heads);
  LoadTileAsync<D, kTile>(dos, static_cast<const bf16*>(p.dout), it.q_start, it.tile_row, len,
                          it.head, p.heads);
  CpAsyncCommit();
  LoadQkRope<D>(qs, ks, it, p);
  CpAsyncWait<0>();
  __syncthreads();
  const bool full = it.tile_row + kTile <= len;
  const float one[2] = {1.f, 1.f};

  // Phase 1, warp = 16 queries: probabilities from the whole score row, dQ.
  {
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
        if (t == 0) {
          const int il = warp * 16 + g + 8 * r;
          lse_s[il] = sum > 0.f ? m_use + log2f(sum) : 0.f;
          dsum_s[il] = dsum;
        }
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          dp[nt][e] = s[nt][e] == -INFINITY ? 0.f : dp[nt][e] * ActGrad<A>(s[nt][e]);
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
    float dq[D / 8][4];
    Zero(dq);
    GemmPB<D, 8>(dq, dp, ks, 0);
    if (p.rope) RopeInverse<D>(dq, row_base, p);
    StoreRows<D>(p.dq, dq, it.q_start, row_base, len, it.head, p.heads, one);
  }
  __syncthreads();

  // Phase 2, warp = 16 keys: the transposed scores with the statistics of
  // phase 1, dK and dV.
  {
    const int kv_base = it.tile_row + warp * 16 + g;
    float st[8][4], dpt[8][4];
    Zero(st);
    Zero(dpt);
    GemmABtSmem<D, 8>(st, ks, warp * 16, qs, 0);
    GemmABtSmem<D, 8>(dpt, vs, warp * 16, dos, 0);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = kv_base + (e >> 1) * 8, il = nt * 8 + 2 * t + (e & 1);
        const int i = it.tile_row + il;
        const bool vis = full || (i < len && j < len);
        float x = st[nt][e] * p.scale;
        if (p.bias != nullptr && vis) x += BiasAt(p, it, i, j);
        float pr, ds;
        if constexpr (A == kActSoftmax) {
          pr = vis ? Exp2(x * kLog2e - lse_s[il]) : 0.f;
          ds = pr * (dpt[nt][e] - dsum_s[il]);
        } else {
          pr = vis ? Act<A>(x) : 0.f;
          ds = vis ? dpt[nt][e] * ActGrad<A>(x) : 0.f;
        }
        st[nt][e] = pr;
        dpt[nt][e] = ds * p.scale;
      }
    }
    float dv[D / 8][4];
    Zero(dv);
    GemmPB<D, 8>(dv, st, dos, 0);
    StoreRows<D>(p.dv, dv, it.k_start, kv_base, len, it.head, p.heads, one);
    float dk[D / 8][4];
    Zero(dk);
    GemmPB<D, 8>(dk, dpt, qs, 0);
    if (p.rope) RopeInverse<D>(dk, kv_base, p);
    StoreRows<D>(p.dk, dk, it.k_start, kv_base, len, it.head, p.heads, one);
  }
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
    return Launch(BlockBackwardKernel<D, A>, p.num_items, 4 * kTile * D * 2 + 2 * kTile * 4, p,
                  stream);
  });
}

}  // namespace recfleet::attention::cuda_impl
