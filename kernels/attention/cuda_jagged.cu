// Jagged flash attention (JFA / GDPA): forward, and the backward as two
// passes without atomics (dQ with queries stationary, dK/dV with keys
// stationary), each CTA one 64-row tile of one (sequence, head) from the
// host-planned work list. Tiles of the other side stream through a two-stage
// cp.async pipeline; rows past a sequence end are zero-filled at load, and
// the element-wise mask runs only on tiles the mask cuts.

#include <cmath>

#include "kernels/attention/cuda_common.cuh"

namespace recfleet::attention::cuda_impl {
namespace {

constexpr int kTile = kTileRows;

// Starts loading K and V rows [row0, row0 + kTile) of the CTA's head.
template <int D>
__device__ __forceinline__ void LoadKvTileAsync(bf16* ks, bf16* vs, const KernelParams& p,
                                                const WorkItem& it, int row0) {
  LoadTileAsync<D, kTile>(ks, static_cast<const bf16*>(p.k), it.k_start, row0, it.k_len, it.head,
                          p.heads);
  LoadTileAsync<D, kTile>(vs, static_cast<const bf16*>(p.v), it.k_start, row0, it.k_len, it.head,
                          p.heads);
}

// One step of the two-stage K/V stream: starts loading tile n + 1 into the
// other stage, then waits until tile n (stage n & 1) has landed for all.
template <int D>
__device__ __forceinline__ void KvPipelineStep(bf16* ks, bf16* vs, const KernelParams& p,
                                               const WorkItem& it, int n, int n_tiles) {
  const int next = (n & 1) ^ 1;
  if (n + 1 < n_tiles) {
    LoadKvTileAsync<D>(ks + next * kTile * D, vs + next * kTile * D, p, it,
                       it.inner_begin + (n + 1) * kTile);
  }
  CpAsyncCommit();
  CpAsyncWait<1>();
  __syncthreads();
}

// Forward: each warp owns 16 * kForwardRowBlocks query rows of the CTA's
// 64 * kForwardRowBlocks, so every K/V fragment read from shared memory feeds
// kForwardRowBlocks row blocks.
template <int D, int A>
__global__ void __launch_bounds__(kThreads) JaggedForwardKernel(const KernelParams p) {
  constexpr int M = kForwardRowBlocks;
  constexpr int kRows = kForwardTileRows;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + kRows * D;      // two stages
  bf16* vs = ks + 2 * kTile * D;  // two stages
  const WorkItem it = LoadItem(p);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n_tiles = (it.inner_end - it.inner_begin + kTile - 1) / kTile;

  LoadTileAsync<D, kRows>(qs, static_cast<const bf16*>(p.q), it.q_start, it.tile_row, it.q_len,
                          it.head, p.heads);
  if (n_tiles > 0) LoadKvTileAsync<D>(ks, vs, p, it, it.inner_begin);
  CpAsyncCommit();

  const int warp_row0 = warp * 16 * M;  // within the tile
  const float scale_log2 = p.scale * kLog2e;
  float o[M][D / 8][4], m[M][2], l[M][2];
#pragma unroll
  for (int mm = 0; mm < M; ++mm) {
    Zero(o[mm]);
    m[mm][0] = m[mm][1] = -INFINITY;
    l[mm][0] = l[mm][1] = 0.f;
  }

  for (int n = 0; n < n_tiles; ++n) {
    const int buf = n & 1;
    KvPipelineStep<D>(ks, vs, p, it, n, n_tiles);

    float s[M][8][4];
#pragma unroll
    for (int mm = 0; mm < M; ++mm) Zero(s[mm]);
    GemmABtM<D, 8, M>(s, qs, warp_row0, ks + buf * kTile * D, 0);
    const int col0 = it.inner_begin + n * kTile;
    if (p.bias == nullptr && TileFull(p, it.q_len, it.k_len, it.tile_row, kRows, col0, kTile)) {
#pragma unroll
      for (int mm = 0; mm < M; ++mm) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if constexpr (A == kActSoftmax) {
              s[mm][nt][e] *= scale_log2;
            } else {
              s[mm][nt][e] = Act<A>(s[mm][nt][e] * p.scale);
            }
          }
        }
      }
    } else {
#pragma unroll
      for (int mm = 0; mm < M; ++mm) {
        int lo[2], hi[2];  // recomputed here: masked tiles are the minority
        RowKeyRanges(p, it.q_len, it.k_len, it.tile_row + warp_row0 + mm * 16 + g, lo, hi);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1, j = col0 + nt * 8 + 2 * t + (e & 1);
            const bool vis = j >= lo[r] && j < hi[r];
            float x = s[mm][nt][e] * p.scale;
            if (p.bias != nullptr && vis) {
              x += BiasAt(p, it, it.tile_row + warp_row0 + mm * 16 + g + 8 * r, j);
            }
            if constexpr (A == kActSoftmax) {
              s[mm][nt][e] = vis ? x * kLog2e : -INFINITY;
            } else {
              s[mm][nt][e] = vis ? Act<A>(x) : 0.f;
            }
          }
        }
      }
    }
    if constexpr (A == kActSoftmax) {
#pragma unroll
      for (int mm = 0; mm < M; ++mm) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            mx = fmaxf(mx, fmaxf(s[mm][nt][2 * r], s[mm][nt][2 * r + 1]));
          }
          const float m_new = fmaxf(m[mm][r], QuadMax(mx));
          const float m_use = m_new == -INFINITY ? 0.f : m_new;
          const float corr = Exp2(m[mm][r] - m_use);
          m[mm][r] = m_new;
          l[mm][r] *= corr;
#pragma unroll
          for (int dt = 0; dt < D / 8; ++dt) {
            o[mm][dt][2 * r] *= corr;
            o[mm][dt][2 * r + 1] *= corr;
          }
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            s[mm][nt][2 * r] = Exp2(s[mm][nt][2 * r] - m_use);
            s[mm][nt][2 * r + 1] = Exp2(s[mm][nt][2 * r + 1] - m_use);
            l[mm][r] += s[mm][nt][2 * r] + s[mm][nt][2 * r + 1];
          }
        }
      }
    }
    GemmPBM<D, 8, M>(o, s, vs + buf * kTile * D, 0);
    __syncthreads();
  }

#pragma unroll
  for (int mm = 0; mm < M; ++mm) {
    const int row_base = it.tile_row + warp_row0 + mm * 16 + g;
    float mul[2] = {1.f, 1.f};
    if constexpr (A == kActSoftmax) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float sum = QuadSum(l[mm][r]);
        mul[r] = sum > 0.f ? 1.f / sum : 0.f;
        const int i = row_base + 8 * r;
        if (t == 0 && i < it.q_len) {
          p.lse[(it.q_start + i) * p.heads + it.head] =
              sum > 0.f ? (m[mm][r] + log2f(sum)) * kLn2 : -INFINITY;
        }
      }
    }
    StoreRows<D>(p.o, o[mm], it.q_start, row_base, it.q_len, it.head, p.heads, mul);
  }
}

template <int D, int A>
__global__ void __launch_bounds__(kThreads) JaggedDqKernel(const KernelParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* dos = qs + kTile * D;
  bf16* ks = dos + kTile * D;     // two stages
  bf16* vs = ks + 2 * kTile * D;  // two stages
  const WorkItem it = LoadItem(p);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n_tiles = (it.inner_end - it.inner_begin + kTile - 1) / kTile;

  LoadTileAsync<D, kTile>(qs, static_cast<const bf16*>(p.q), it.q_start, it.tile_row, it.q_len,
                          it.head, p.heads);
  LoadTileAsync<D, kTile>(dos, static_cast<const bf16*>(p.dout), it.q_start, it.tile_row,
                          it.q_len, it.head, p.heads);
  if (n_tiles > 0) LoadKvTileAsync<D>(ks, vs, p, it, it.inner_begin);
  CpAsyncCommit();

  const int row_base = it.tile_row + warp * 16 + g;
  float lse2[2] = {0.f, 0.f}, dsum[2] = {0.f, 0.f};
  if constexpr (A == kActSoftmax) QueryRowStats(p, it, row_base, lse2, dsum);
  const float scale_log2 = p.scale * kLog2e;
  int lo[2], hi[2];
  RowKeyRanges(p, it.q_len, it.k_len, row_base, lo, hi);
  float dq[D / 8][4];
  Zero(dq);

  for (int n = 0; n < n_tiles; ++n) {
    const int buf = n & 1;
    KvPipelineStep<D>(ks, vs, p, it, n, n_tiles);

    const bf16* kb = ks + buf * kTile * D;
    float s[8][4], dp[8][4];
    Zero(s);
    Zero(dp);
    GemmABtSmem<D, 8>(s, qs, warp * 16, kb, 0);
    GemmABtSmem<D, 8>(dp, dos, warp * 16, vs + buf * kTile * D, 0);
    const int col0 = it.inner_begin + n * kTile;
    if (p.bias == nullptr && TileFull(p, it.q_len, it.k_len, it.tile_row, kTile, col0, kTile)) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float ds;
          if constexpr (A == kActSoftmax) {
            ds = Exp2(fmaf(s[nt][e], scale_log2, -lse2[e >> 1])) * (dp[nt][e] - dsum[e >> 1]);
          } else {
            ds = dp[nt][e] * ActGrad<A>(s[nt][e] * p.scale);
          }
          s[nt][e] = ds * p.scale;
        }
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, i = row_base + 8 * r, j = col0 + nt * 8 + 2 * t + (e & 1);
          const bool vis = j >= lo[r] && j < hi[r];
          float x = s[nt][e] * p.scale;
          if (p.bias != nullptr && vis) x += BiasAt(p, it, i, j);
          float ds;
          if constexpr (A == kActSoftmax) {
            const float pr = vis ? Exp2(x * kLog2e - lse2[r]) : 0.f;
            ds = pr * (dp[nt][e] - dsum[r]);
          } else {
            ds = vis ? dp[nt][e] * ActGrad<A>(x) : 0.f;
          }
          s[nt][e] = ds * p.scale;
        }
      }
    }
    GemmPB<D, 8>(dq, s, kb, 0);
    __syncthreads();
  }
  const float one[2] = {1.f, 1.f};
  StoreRows<D>(p.dq, dq, it.q_start, row_base, it.q_len, it.head, p.heads, one);
}

// dq_accum[q0 + 16 w .. + 16, :] += dS[16 w .., kTile] * K[kTile, D] for
// warp w, with dS read transposed from dst_s ([kTile keys][KQ queries]) and
// the product formed 32 columns at a time to bound the live registers.
template <int D, int KQ>
__device__ __forceinline__ void AtomicDq(const KernelParams& p, const WorkItem& it,
                                         const bf16* dst_s, const bf16* ks, int q0) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int qb = warp * 16; qb < KQ; qb += 16 * (kThreads / 32)) {
#pragma unroll
    for (int dc = 0; dc < D / 32; ++dc) {
      float acc[4][4];
      Zero(acc);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        uint32_t a[4];
        Ldsm4T(a, dst_s + Swz<KQ>(kk * 16 + (lane & 7) + (lane >> 4) * 8,
                                  qb + ((lane >> 3) & 1) * 8));
#pragma unroll
        for (int dn = 0; dn < 2; ++dn) {
          uint32_t b[4];
          Ldsm4T(b, ks + Swz<D>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                dc * 32 + dn * 16 + (lane >> 4) * 8));
          Mma(acc[2 * dn], a, b[0], b[1]);
          Mma(acc[2 * dn + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = q0 + qb + g + 8 * r;
        if (i >= it.q_len) continue;
        float* row = p.dq_accum + ((it.q_start + i) * p.heads + it.head) * D + dc * 32 + 2 * t;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          atomicAdd(row + nt * 8, acc[nt][2 * r]);
          atomicAdd(row + nt * 8 + 1, acc[nt][2 * r + 1]);
        }
      }
    }
  }
}

template <int D>
constexpr int DkDvQueryTile() {
  return 64;
}

template <int D, int A>
__global__ void __launch_bounds__(kThreads) JaggedDkDvKernel(const KernelParams p) {
  constexpr int KQ = DkDvQueryTile<D>();
  constexpr int QT = KQ / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);
  bf16* vs = ks + kTile * D;
  bf16* qs = vs + kTile * D;    // two stages
  bf16* dos = qs + 2 * KQ * D;  // two stages
  float* lse_s = reinterpret_cast<float*>(dos + 2 * KQ * D);  // [2][KQ]
  float* dsum_s = lse_s + 2 * KQ;                               // [2][KQ]
  bf16* dst_s = reinterpret_cast<bf16*>(dsum_s + 2 * KQ);      // [kTile][KQ]: dS^T * scale
  const WorkItem it = LoadItem(p);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const bf16* q = static_cast<const bf16*>(p.q);
  const bf16* dout = static_cast<const bf16*>(p.dout);
  const int n_tiles = (it.inner_end - it.inner_begin + KQ - 1) / KQ;

  auto load_q_tile = [&](int buf, int q0) {
    LoadTileAsync<D, KQ>(qs + buf * KQ * D, q, it.q_start, q0, it.q_len, it.head, p.heads);
    LoadTileAsync<D, KQ>(dos + buf * KQ * D, dout, it.q_start, q0, it.q_len, it.head, p.heads);
    if constexpr (A == kActSoftmax) {
      for (int idx = threadIdx.x; idx < KQ; idx += kThreads) {
        const int i = q0 + idx;
        float l2 = 0.f, ds = 0.f;
        if (i < it.q_len) {
          const int64_t rh = (it.q_start + i) * p.heads + it.head;
          l2 = Lse2(p, rh);
          ds = p.dsum[rh];
        }
        lse_s[buf * KQ + idx] = l2;
        dsum_s[buf * KQ + idx] = ds;
      }
    }
  };

  LoadKvTileAsync<D>(ks, vs, p, it, it.tile_row);
  if (n_tiles > 0) load_q_tile(0, it.inner_begin);
  CpAsyncCommit();

  float dk[D / 8][4], dv[D / 8][4];
  Zero(dk);
  Zero(dv);
  const int kv_base = it.tile_row + warp * 16 + g;
  const float scale_log2 = p.scale * kLog2e;
  int qlo[2], qhi[2];  // queries seeing this thread's two key rows
#pragma unroll
  for (int r = 0; r < 2; ++r) QueryRangeOf(p, it.q_len, it.k_len, kv_base + 8 * r, qlo[r], qhi[r]);

  for (int n = 0; n < n_tiles; ++n) {
    const int buf = n & 1;
    if (n + 1 < n_tiles) load_q_tile(buf ^ 1, it.inner_begin + (n + 1) * KQ);
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();

    const bf16* qb = qs + buf * KQ * D;
    const bf16* dob = dos + buf * KQ * D;
    float st[QT][4], dpt[QT][4];
    Zero(st);
    Zero(dpt);
    GemmABtSmem<D, QT>(st, ks, warp * 16, qb, 0);
    GemmABtSmem<D, QT>(dpt, vs, warp * 16, dob, 0);
    const int q0 = it.inner_begin + n * KQ;
    const float* lse_b = lse_s + buf * KQ;
    const float* dsum_b = dsum_s + buf * KQ;
    if (p.bias == nullptr && TileFull(p, it.q_len, it.k_len, q0, KQ, it.tile_row, kTile)) {
#pragma unroll
      for (int nt = 0; nt < QT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int il = nt * 8 + 2 * t + (e & 1);
          float pr, ds;
          if constexpr (A == kActSoftmax) {
            pr = Exp2(fmaf(st[nt][e], scale_log2, -lse_b[il]));
            ds = pr * (dpt[nt][e] - dsum_b[il]);
          } else {
            const float x = st[nt][e] * p.scale;
            pr = Act<A>(x);
            ds = dpt[nt][e] * ActGrad<A>(x);
          }
          st[nt][e] = pr;
          dpt[nt][e] = ds * p.scale;
        }
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < QT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, j = kv_base + 8 * r, il = nt * 8 + 2 * t + (e & 1), i = q0 + il;
          const bool vis = i >= qlo[r] && i < qhi[r];
          float x = st[nt][e] * p.scale;
          if (p.bias != nullptr && vis) x += BiasAt(p, it, i, j);
          float pr, ds;
          if constexpr (A == kActSoftmax) {
            pr = vis ? Exp2(x * kLog2e - lse_b[il]) : 0.f;
            ds = pr * (dpt[nt][e] - dsum_b[il]);
          } else {
            pr = vis ? Act<A>(x) : 0.f;
            ds = vis ? dpt[nt][e] * ActGrad<A>(x) : 0.f;
          }
          if (p.dbias != nullptr && vis) StoreBias(p, it, i, j, ds);
          st[nt][e] = pr;
          dpt[nt][e] = ds * p.scale;
        }
      }
    }
    GemmPB<D, QT>(dv, st, dob, 0);
    GemmPB<D, QT>(dk, dpt, qb, 0);
    if (p.dq_accum != nullptr) {
      // Fused dQ: dS^T goes through shared memory so that each warp can
      // multiply 16 query rows of dS by the whole key tile, and the partial
      // dQ is added to an fp32 accumulator with atomics.
#pragma unroll
      for (int nt = 0; nt < QT; ++nt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          *reinterpret_cast<__nv_bfloat162*>(
              dst_s + Swz<KQ>(warp * 16 + g + 8 * r, nt * 8 + 2 * t)) =
              __floats2bfloat162_rn(dpt[nt][2 * r], dpt[nt][2 * r + 1]);
        }
      }
      __syncthreads();
      AtomicDq<D, KQ>(p, it, dst_s, ks, q0);
    }
    __syncthreads();
  }
  const float one[2] = {1.f, 1.f};
  StoreRows<D>(p.dk, dk, it.k_start, kv_base, it.k_len, it.head, p.heads, one);
  StoreRows<D>(p.dv, dv, it.k_start, kv_base, it.k_len, it.head, p.heads, one);
}

}  // namespace

int LaunchJaggedForward(const KernelParams& p, void* stream) {
  return DispatchKernel(p, [&](auto d, auto a) {
    constexpr int D = decltype(d)::value, A = decltype(a)::value;
    return Launch(JaggedForwardKernel<D, A>, p.num_items, (kForwardTileRows + 4 * kTile) * D * 2,
                  p, stream);
  });
}

int LaunchJaggedBackwardDq(const KernelParams& p, void* stream) {
  return DispatchKernel(p, [&](auto d, auto a) {
    constexpr int D = decltype(d)::value, A = decltype(a)::value;
    return Launch(JaggedDqKernel<D, A>, p.num_items, 6 * kTile * D * 2, p, stream);
  });
}

int LaunchJaggedBackwardDkDv(const KernelParams& p, void* stream) {
  return DispatchKernel(p, [&](auto d, auto a) {
    constexpr int D = decltype(d)::value, A = decltype(a)::value;
    constexpr int KQ = DkDvQueryTile<D>();
    return Launch(JaggedDkDvKernel<D, A>, p.num_items,
                  (2 * kTile + 4 * KQ) * D * 2 + 4 * KQ * 4 + kTile * KQ * 2, p, stream);
  });
}

}  // namespace recfleet::attention::cuda_impl
