// Device building blocks shared by the attention kernels: warp-level bf16
// tensor-core GEMMs (mma.sync m16n8k16 fed by ldmatrix from swizzled shared
// memory), asynchronous tile loads, the mask, the activations and RoPE.
//
// Fragment layout of one warp's 16 x 8 fp32 accumulator tile (g = lane / 4,
// t = lane % 4): acc[e] sits at row g + 8 * (e / 2), column 2 * t + e % 2.
// An accumulator array acc[N][4] covers 16 rows x 8N columns.

#ifndef RECFLEET_KERNELS_ATTENTION_CUDA_COMMON_CUH_
#define RECFLEET_KERNELS_ATTENTION_CUDA_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/attention/cuda_kernels.h"
#include "kernels/attention/tile_mask.h"

namespace recfleet::attention::cuda_impl {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 128;  // 4 warps; each owns 16 rows of a 64-row tile.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Element offset of (row, col) in a [rows][D] bf16 tile whose 16-byte chunks
// are XOR-swizzled by row, so that ldmatrix's 8 row addresses hit 8 distinct
// bank groups. `col` is a multiple of 8 plus an offset inside the chunk.
template <int D>
__device__ __forceinline__ int Swz(int row, int col) {
  return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Starts copying rows [row0, row0 + ROWS) of one head of a sequence (global
// rows start..start+len) into a swizzled tile; rows outside the sequence are
// zero-filled, so they add nothing to the products.
template <int D, int ROWS>
__device__ __forceinline__ void LoadTileAsync(bf16* s, const bf16* g, int64_t start, int row0,
                                              int len, int head, int heads) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    const int row = row0 + r;
    const bool ok = row >= 0 && row < len;
    const bf16* src = ok ? g + ((start + row) * heads + head) * D + c : g;
    CpAsync16(s + Swz<D>(r, c), src, ok);
  }
}

__device__ __forceinline__ void Ldsm4(uint32_t (&r)[4], const bf16* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void Ldsm4T(uint32_t (&r)[4], const bf16* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// acc[m][16 x 8N] += A[a_row0 + 16m .. + 16, D] * B[b_row0 .. b_row0 + 8N, D]^T
// for M row blocks, A and B swizzled row-major tiles. Each B fragment loaded
// from shared memory feeds 2M MMAs, so M = 2 halves the shared-memory
// traffic per MMA.
template <int D, int N, int M>
__device__ __forceinline__ void GemmABtM(float (&acc)[M][N][4], const bf16* As, int a_row0,
                                         const bf16* Bs, int b_row0) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[M][4];
#pragma unroll
    for (int mm = 0; mm < M; ++mm) {
      Ldsm4(a[mm], As + Swz<D>(a_row0 + mm * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
    }
#pragma unroll
    for (int np = 0; np < N / 2; ++np) {
      uint32_t b[4];
      Ldsm4(b, Bs + Swz<D>(b_row0 + np * 16 + (lane & 7) + (lane >> 4) * 8,
                           kk * 16 + ((lane >> 3) & 1) * 8));
#pragma unroll
      for (int mm = 0; mm < M; ++mm) {
        Mma(acc[mm][2 * np], a[mm], b[0], b[1]);
        Mma(acc[mm][2 * np + 1], a[mm], b[2], b[3]);
      }
    }
  }
}

// One row block of GemmABtM.
template <int D, int N>
__device__ __forceinline__ void GemmABtSmem(float (&acc)[N][4], const bf16* As, int a_row0,
                                            const bf16* Bs, int b_row0) {
  GemmABtM<D, N, 1>(reinterpret_cast<float(&)[1][N][4]>(acc), As, a_row0, Bs, b_row0);
}

// acc[m][16 x D] += P[m][16 x 8K] * B[b_row0 .. b_row0 + 8K, D], P given as
// fp32 accumulators (rounded to bf16 here), B a swizzled row-major tile.
template <int D, int K, int M>
__device__ __forceinline__ void GemmPBM(float (&acc)[M][D / 8][4], const float (&p)[M][K][4],
                                        const bf16* Bs, int b_row0) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < K / 2; ++kk) {
    uint32_t a[M][4];
#pragma unroll
    for (int mm = 0; mm < M; ++mm) {
      a[mm][0] = Pack(p[mm][2 * kk][0], p[mm][2 * kk][1]);
      a[mm][1] = Pack(p[mm][2 * kk][2], p[mm][2 * kk][3]);
      a[mm][2] = Pack(p[mm][2 * kk + 1][0], p[mm][2 * kk + 1][1]);
      a[mm][3] = Pack(p[mm][2 * kk + 1][2], p[mm][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      uint32_t b[4];
      Ldsm4T(b, Bs + Swz<D>(b_row0 + kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                            dn * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int mm = 0; mm < M; ++mm) {
        Mma(acc[mm][2 * dn], a[mm], b[0], b[1]);
        Mma(acc[mm][2 * dn + 1], a[mm], b[2], b[3]);
      }
    }
  }
}

// One row block of GemmPBM.
template <int D, int K>
__device__ __forceinline__ void GemmPB(float (&acc)[D / 8][4], const float (&p)[K][4],
                                       const bf16* Bs, int b_row0) {
  GemmPBM<D, K, 1>(reinterpret_cast<float(&)[1][D / 8][4]>(acc),
                   reinterpret_cast<const float(&)[1][K][4]>(p), Bs, b_row0);
}

template <int N>
__device__ __forceinline__ void Zero(float (&acc)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.f;
  }
}

__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float Tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---- Mask: the same key ranges as internal::VisibleKeys (tile_mask.h). ----
__device__ __forceinline__ void KeyRangeOf(const KernelParams& p, int lq, int lk, int i, int& lo,
                                           int& hi) {
  MaskKeyRange(p.mask, p.window, lq, lk, i, lo, hi);
}
// The keys visible to the two accumulator rows a thread owns (rows past the
// sequence end see none). Ranges depend on the row only, so a kernel computes
// them once and masks each element with two compares.
__device__ __forceinline__ void RowKeyRanges(const KernelParams& p, int lq, int lk, int row_base,
                                             int (&lo)[2], int (&hi)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row_base + 8 * r;
    lo[r] = hi[r] = 0;
    if (i < lq) KeyRangeOf(p, lq, lk, i, lo[r], hi[r]);
  }
}
// The queries that see key j: contiguous as well (the inverse of KeyRangeOf).
__device__ __forceinline__ void QueryRangeOf(const KernelParams& p, int lq, int lk, int j, int& lo,
                                             int& hi) {
  const int off = lk - lq;  // pq_i = i + off
  lo = 0;
  hi = lq;
  if (j >= lk) {
    hi = 0;
    return;
  }
  if (p.mask == kMaskCausal || p.mask == kMaskWindow) lo = max(0, j - off);
  if (p.mask == kMaskWindow) hi = min(lq, j - off + p.window);
  if (p.mask == kMaskBlock) {
    const int b0 = (j / 64) * 64;
    lo = max(0, b0 - off);
    hi = min(lq, b0 + 64 - off);
  }
  if (hi < lo) hi = lo;
}
// The class of queries [i0, i0 + rows) x keys [j0, j0 + cols) (tile_mask.h).
__device__ __forceinline__ TileClass ClassOf(const KernelParams& p, int lq, int lk, int i0,
                                             int rows, int j0, int cols) {
  return ClassifyTile(p.mask, p.window, lq, lk, i0, rows, j0, cols);
}
// Whether every pair of that tile is visible.
__device__ __forceinline__ bool TileFull(const KernelParams& p, int lq, int lk, int i0, int rows,
                                         int j0, int cols) {
  return ClassOf(p, lq, lk, i0, rows, j0, cols) == kTileFull;
}

// ---- Activations. ----
// GELU on one special-function call: x Phi(x) with Phi(x) ~ (1 + tanh(x (a +
// b x^2))) / 2, the tanh form with (a, b) fitted for the smallest max error of
// both the GELU and its derivative against the exact (erf) GELU: 5.0e-4 each
// on the whole real line (the textbook constants: 4.7e-4 and 8.7e-4). The
// tanh.approx.f32 (relative error ~2^-11) adds at most ~2.5e-4 |x| to the
// GELU and up to ~2e-3 to its derivative near |x| = 2. No range assumption
// (tanh saturates; the derivative's x^2 overflows only past |x| = 1e19;
// attention_cuda_test holds all of it). It replaced a degree-8
// polynomial for Phi (error 5e-5, but ~14 FMA-pipe instructions per score in
// the forward and ~27 with the derivative in the backward, the limit of the
// GELU kernels; see bench/RESULTS.md, attention).
constexpr float kGeluA = 0.7996798f;
constexpr float kGeluB = 0.0354990f;
// tanh of the GELU's argument at x (u = x^2).
__device__ __forceinline__ float GeluTanh(float x, float u) {
  return Tanh(x * fmaf(kGeluB, u, kGeluA));
}

// The activations of x = 2h (callers fold the 1/2 into their scale).
// SiLU: x sigmoid(x) = x (1 + tanh(x / 2)) / 2 = h + h tanh(h), one
// special-function call and one FMA. GELU: h + h tanh(h (2a + 8b h^2)).
template <int A>
__device__ __forceinline__ float ActOfHalf(float h) {
  if constexpr (A == kActGelu) {
    return fmaf(h, Tanh(h * fmaf(8.f * kGeluB, h * h, 2.f * kGeluA)), h);
  } else {
    return fmaf(h, Tanh(h), h);
  }
}

template <int A>
__device__ __forceinline__ float Act(float x) {
  return ActOfHalf<A>(0.5f * x);
}
// The activation and its derivative at x, sharing the special-function call.
template <int A>
__device__ __forceinline__ void ActAndGrad(float x, float& y, float& dy) {
  if constexpr (A == kActGelu) {
    const float u = x * x, th = GeluTanh(x, u);
    const float phi = fmaf(0.5f, th, 0.5f);
    y = x * phi;
    // Phi' = (1 - th^2) (a + 3 b u) / 2.
    const float dphi = fmaf(-th, th, 1.f) * fmaf(1.5f * kGeluB, u, 0.5f * kGeluA);
    dy = fmaf(x, dphi, phi);
  } else {
    // With h = x / 2: y = h (1 + tanh h), y' = s (1 + x (1 - s)) = s (1 + h
    // (1 - tanh h)) for s = sigmoid(x) = (1 + tanh h) / 2.
    const float h = 0.5f * x, th = Tanh(h);
    y = fmaf(h, th, h);
    dy = fmaf(0.5f, th, 0.5f) * (fmaf(-h, th, h) + 1.f);
  }
}
template <int A>
__device__ __forceinline__ float ActGrad(float x) {
  float y, dy;
  ActAndGrad<A>(x, y, dy);
  return dy;
}

// ---- RoPE: angle = pos * theta^(-2c/d) for pair (c, c + d/2). ----
__device__ __forceinline__ float RopeInvFreq(int c, int d, float log2_theta) {
  return exp2f(-(2.f * c / d) * log2_theta);
}
__device__ __forceinline__ void RopeCosSinOf(float ang, float& cs, float& sn) {
  // Exact-enough range reduction, then the fast sincos on [-pi, pi].
  const float k = rintf(ang * 0.15915494309189535f);
  float r = fmaf(-k, 6.28318548202514648f, ang);
  r = fmaf(-k, -1.7484555e-7f, r);
  __sincosf(r, &sn, &cs);
}
__device__ __forceinline__ void RopeCosSin(int pos, int c, int d, float log2_theta, float& cs,
                                           float& sn) {
  RopeCosSinOf(static_cast<float>(pos) * RopeInvFreq(c, d, log2_theta), cs, sn);
}

// Work item w (a CTA of a non-persistent grid, a step of a persistent one):
// items are planned per (sequence, tile) and shared by all heads; the heads
// of one item are consecutive, so the longest-first order of the plan holds
// for the whole grid.
__device__ __forceinline__ WorkItem ItemAt(const KernelParams& p, int w) {
  WorkItem it = p.items[w / p.heads];
  it.head = w % p.heads;
  it.bias_base += static_cast<int64_t>(it.head) * it.q_len * it.k_len;
  return it;
}
// This CTA's work item.
__device__ __forceinline__ WorkItem LoadItem(const KernelParams& p) {
  return ItemAt(p, blockIdx.x);
}

// ---- Shared epilogue pieces. ----
// log2-domain lse of a row (0 where the row sees no key: its scores are all
// masked, so any finite value gives p = 0 instead of NaN).
__device__ __forceinline__ float Lse2(const KernelParams& p, int64_t row_head) {
  const float v = p.lse[row_head];
  return isinf(v) ? 0.f : v * kLog2e;
}

__device__ __forceinline__ float BiasAt(const KernelParams& p, const WorkItem& it, int i, int j) {
  return __bfloat162float(
      static_cast<const bf16*>(p.bias)[it.bias_base + static_cast<int64_t>(i) * it.k_len + j]);
}
// The softmax backward's per-query statistics of a thread's two rows
// (row_base and row_base + 8): log2-domain lse and rowsum(dO * O), zero past
// the sequence end.
__device__ __forceinline__ void QueryRowStats(const KernelParams& p, const WorkItem& it,
                                              int row_base, float (&lse2)[2], float (&dsum)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row_base + 8 * r;
    lse2[r] = dsum[r] = 0.f;
    if (i < it.q_len) {
      const int64_t rh = (it.q_start + i) * p.heads + it.head;
      lse2[r] = Lse2(p, rh);
      dsum[r] = p.dsum[rh];
    }
  }
}
__device__ __forceinline__ void StoreBias(const KernelParams& p, const WorkItem& it, int i, int j,
                                          float v) {
  static_cast<bf16*>(p.dbias)[it.bias_base + static_cast<int64_t>(i) * it.k_len + j] =
      __float2bfloat16(v);
}

// Sum over the 4 lanes of a quad (the threads sharing an accumulator row).
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// Writes a warp's [16, D] accumulator rows (row of acc[.][0..1] is
// row_base, of acc[.][2..3] row_base + 8) as bf16, each row r scaled by
// mul[r]; rows at or past `len` are skipped.
template <int D>
__device__ __forceinline__ void StoreRows(void* dst, const float (&acc)[D / 8][4], int64_t start,
                                          int row_base, int len, int head, int heads,
                                          const float (&mul)[2]) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_base + 8 * r;
    if (row >= len) continue;
    bf16* out = static_cast<bf16*>(dst) + ((start + row) * heads + head) * D + 2 * t;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<__nv_bfloat162*>(out + dt * 8) =
          __floats2bfloat162_rn(acc[dt][2 * r] * mul[r], acc[dt][2 * r + 1] * mul[r]);
    }
  }
}

// StoreRows through shared memory: a warp's 16 accumulator rows (scaled by
// mul, rounded to bf16) go to rows stage_row .. stage_row + 15 of a swizzled
// [.][D] tile that no other warp touches meanwhile, then leave as 16-byte
// stores of whole row segments to rows row0 .. row0 + 15 of the sequence
// (those at or past `len` skipped). The caller orders every earlier read of
// those staging rows before the call.
template <int D>
__device__ __forceinline__ void StoreRowsStaged(void* dst, const float (&acc)[D / 8][4],
                                                bf16* stage, int stage_row, int64_t start,
                                                int row0, int len, int head, int heads,
                                                const float (&mul)[2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int sr = stage_row + g + 8 * r;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<__nv_bfloat162*>(stage + Swz<D>(sr, dt * 8 + 2 * t)) =
          __floats2bfloat162_rn(acc[dt][2 * r] * mul[r], acc[dt][2 * r + 1] * mul[r]);
    }
  }
  __syncwarp();
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int idx = lane; idx < 16 * kChunks; idx += 32) {
    const int r = idx / kChunks, c = (idx % kChunks) * 8;
    if (row0 + r < len) {
      bf16* out = static_cast<bf16*>(dst) + ((start + row0 + r) * heads + head) * D + c;
      *reinterpret_cast<uint4*>(out) =
          *reinterpret_cast<const uint4*>(stage + Swz<D>(stage_row + r, c));
    }
  }
  __syncwarp();
}

// Calls f(integral_constant<int, D>, integral_constant<int, A>) for the
// runtime head dim and activation: the only instantiations compiled.
template <typename F>
int DispatchKernel(const KernelParams& p, F&& f) {
  using D64 = std::integral_constant<int, 64>;
  using D128 = std::integral_constant<int, 128>;
  using Soft = std::integral_constant<int, kActSoftmax>;
  using Gelu = std::integral_constant<int, kActGelu>;
  using Silu = std::integral_constant<int, kActSilu>;
  if (p.head_dim == 64) {
    if (p.activation == kActSoftmax) return f(D64{}, Soft{});
    if (p.activation == kActGelu) return f(D64{}, Gelu{});
    return f(D64{}, Silu{});
  }
  if (p.activation == kActSoftmax) return f(D128{}, Soft{});
  if (p.activation == kActGelu) return f(D128{}, Gelu{});
  return f(D128{}, Silu{});
}

template <typename Kernel>
int Launch(Kernel kernel, int blocks, int smem_bytes, const KernelParams& p, void* stream) {
  blocks *= p.heads;
  if (blocks == 0) return 0;
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (e != cudaSuccess) return e;
  kernel<<<blocks, kThreads, smem_bytes, static_cast<cudaStream_t>(stream)>>>(p);
  return cudaGetLastError();
}

}  // namespace recfleet::attention::cuda_impl

#endif  // RECFLEET_KERNELS_ATTENTION_CUDA_COMMON_CUH_
