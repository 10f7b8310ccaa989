// Hopper FP8 (e4m3) forward of the jagged softmax attention at head dim 128:
// the quantize pre-pass (LaunchFp8Quantize) and a warp-specialized wgmma
// kernel built from the bf16 forward's pieces (cuda_wgmma.cuh, cuda_wgmma.cu
// for the design): a TMA producer warpgroup, two consumer warpgroups taking
// turns on the tensor cores, S_n issued with P_{n-1} V_{n-1}, persistent CTAs
// over the planner's longest-first grouped tiles.
//
// What FP8 changes:
//   - Operands and scales (cuda_kernels.h, Fp8Operands): power-of-two scales
//     only, so dequantization is exact and no scale costs more than an
//     exponent add. Q carries one scale per token and head over the whole
//     head dim (the reduction dimension of Q K^T), which folds into the
//     softmax's per-row exponent factor; K's per-channel scales are folded
//     into Q before Q is quantized, so the kernel sees no K scale; V's
//     per-channel scales are applied to the output columns in the epilogue.
//   - Q and K tiles are 128 rows (K: 128 or 192, Fp8Config) x 128 bytes:
//     one 128-byte-swizzled column block, loaded by one TMA copy. wgmma e4m3
//     needs both shared-memory operands K-major, so the P V GEMM reads V^T
//     ([d, keys] per head, made by the pre-pass) at column (sequence start
//     + key tile): one 128-key box, or three 64-key boxes (64-byte
//     swizzled) for a 192-key tile. Every tile loads by
//     TMA: rows past a sequence end belong to the next sequence (finite,
//     hidden by the mask like the bf16 kernel's zero-filled rows) and rows
//     past the tensor are zero-filled by TMA.
//   - Key tiles start at a multiple of 32 keys of the whole tensor
//     (ItemKeyTiles): in V^T the key is the innermost coordinate of the TMA
//     box, and a box whose innermost start is not 16-byte aligned faults
//     (cudaErrorIllegalInstruction); 32 also lines the tiles' k32 steps up
//     with V^T's permuted key blocks (next point). An item's first key tile
//     therefore starts up to 31 keys before its first key (the previous
//     sequence's, or zeros), masked like keys outside the row's range; that
//     can add a tile, so the rings are three deep (a grouped item's K/V
//     tiles stay resident while its query tiles pass).
//   - The fp32 accumulator holds a thread's scores at columns 8 q + 2 t,
//     + 1 (q = 0..3) of a k32 step; the e4m3 A fragment wants k indices
//     4 t .. 4 t + 3 and 16 + 4 t .. 16 + 4 t + 3. Rather than moving P
//     between the threads of a quad, the pre-pass stores V^T's keys permuted
//     inside each 32-key block (KeyOfSlot), so that slot 4 t + j holds the
//     key the thread's accumulator has there: P packs in place (PackP), and
//     the P V sum, over the same keys, is unchanged.
//   - P = exp2(s - m + 8) lies in [0, 256 * 2^kLazyMax]: m, the row's
//     running maximum, moves only when a tile's maximum exceeds it by more
//     than kLazyMax (as the row sum, P needs a fixed bound only, e4m3's
//     448), which spares the output's rescaling on most tiles; the row sum
//     carries the same factor, so the output needs no correction.

#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "kernels/attention/cuda_wgmma.cuh"

namespace recfleet::attention::cuda_impl {
namespace {

// The smallest power of two s with amax / s <= 448 (e4m3's largest finite
// value), from the exponent and mantissa bits: amax = 1.m * 2^e and
// 448 = 1.75 * 2^8. 1 for amax = 0.
__device__ __forceinline__ float Fp8Scale(float amax) {
  if (!(amax > 0.f)) return 1.f;
  const uint32_t bits = __float_as_uint(amax);
  const int e = static_cast<int>(bits >> 23) - 127;
  int s = e - 8 + ((bits & 0x7fffffu) > 0x600000u ? 1 : 0);
  s = s < -126 ? -126 : (s > 127 ? 127 : s);
  return __uint_as_float(static_cast<uint32_t>(s + 127) << 23);
}

__device__ __forceinline__ uint32_t E4m3x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ void Bf16x8(const uint4& raw, float (&x)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    x[2 * i] = f.x;
    x[2 * i + 1] = f.y;
  }
}

// ---- Quantize pre-pass. ----
// The key held by slot k of a 32-key block of V^T (file comment): slots
// 4 t + j (j = 0..3) of each half hold keys 2 t, 2 t + 1, 8 + 2 t, 9 + 2 t of
// that half, the accumulator columns of thread t.
__host__ __device__ constexpr int KeyOfSlot(int k) {
  return (k & 16) | (((k & 15) >> 2) << 1) | (k & 1) | ((k & 2) << 2);
}

// amax[z][c] = max over rows of |x_z[r, c]| for x_0 = k and x_1 = v
// ([rows, cols] bf16, cols a multiple of 8), as float bits (non-negative
// floats order as integers). Block: 8 row lanes x 32 lanes of 8-column
// chunks (256 columns), four rows in flight per thread, then one atomic per
// column and block.
__global__ void ChannelAmaxKernel(const bf16* k, const bf16* v, int64_t rows, int cols,
                                  uint32_t* amax) {
  __shared__ float part[8][256 + 8];
  const bf16* x = blockIdx.z == 0 ? k : v;
  const int lane = threadIdx.x % 32, row_lane = threadIdx.x / 32;
  const int chunk = blockIdx.x * 32 + lane;
  float m[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (chunk * 8 < cols) {
    const int64_t step = static_cast<int64_t>(gridDim.y) * 8;
    int64_t r = blockIdx.y * 8 + row_lane;
    for (; r + 3 * step < rows; r += 4 * step) {
      uint4 raw[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        raw[u] = *reinterpret_cast<const uint4*>(x + (r + u * step) * cols + chunk * 8);
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        float f[8];
        Bf16x8(raw[u], f);
#pragma unroll
        for (int i = 0; i < 8; ++i) m[i] = fmaxf(m[i], fabsf(f[i]));
      }
    }
    for (; r < rows; r += step) {
      float f[8];
      Bf16x8(*reinterpret_cast<const uint4*>(x + r * cols + chunk * 8), f);
#pragma unroll
      for (int i = 0; i < 8; ++i) m[i] = fmaxf(m[i], fabsf(f[i]));
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) part[row_lane][lane * 8 + i] = m[i];
  __syncthreads();
  float mx = part[0][threadIdx.x];
#pragma unroll
  for (int j = 1; j < 8; ++j) mx = fmaxf(mx, part[j][threadIdx.x]);
  const int c = blockIdx.x * 256 + threadIdx.x;
  if (c < cols) atomicMax(amax + blockIdx.z * cols + c, __float_as_uint(mx));
}

// 1 / s for a power of two s in [2^-126, 2^126], exactly, by the exponent.
__device__ __forceinline__ float InversePow2(float s) {
  return __uint_as_float(0x7f000000u - __float_as_uint(s));
}

// k_scale[c] = Fp8Scale(k amax[c]) and v_scale[c] = Fp8Scale(v amax[c]).
__global__ void ScalesBothKernel(const uint32_t* amax, int cols, float* k_scale, float* v_scale) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < cols) {
    k_scale[i] = Fp8Scale(__uint_as_float(amax[i]));
  } else if (i < 2 * cols) {
    v_scale[i - cols] = Fp8Scale(__uint_as_float(amax[i]));
  }
}

// The blocks of QuantizeAllKernel (256 threads each), in launch order: V^T
// (128 keys x one head's 128 channels a block), then K (8192 elements), then
// Q (64 (row, head) pairs).
struct QuantizeBlocks {
  int64_t vt, k, q;
  int64_t vt_key_blocks;
  static constexpr int kKElems = 8192;
  static constexpr int kQRowHeads = 64;
  QuantizeBlocks(int64_t q_rows, int64_t kv_rows, int heads, int64_t vt_cols)
      : vt_key_blocks((vt_cols + 127) / 128) {
    vt = vt_key_blocks * heads;
    k = (kv_rows * heads * 128 + kKElems - 1) / kKElems;
    q = (q_rows * heads + kQRowHeads - 1) / kQRowHeads;
  }
};

// 4 x 4 byte transpose: out[c] holds byte c of in[0..3], in order.
__device__ __forceinline__ void Transpose4x4(const uint32_t (&in)[4], uint32_t (&out)[4]) {
  const uint32_t a = __byte_perm(in[0], in[1], 0x5140), b = __byte_perm(in[2], in[3], 0x5140);
  const uint32_t c = __byte_perm(in[0], in[1], 0x7362), d = __byte_perm(in[2], in[3], 0x7362);
  out[0] = __byte_perm(a, b, 0x5410);
  out[1] = __byte_perm(a, b, 0x7632);
  out[2] = __byte_perm(c, d, 0x5410);
  out[3] = __byte_perm(c, d, 0x7632);
}

// Q, K and V^T in one launch (the scales from ScalesBothKernel), every
// thread with several 16-byte loads in flight:
//   V^T: warp w of a block takes channels 16 w .. 16 w + 15 of the block's
//     head and its 128 keys; lane t + 4 h + 8 b loads the four keys that
//     slots 4 t .. 4 t + 3 of half h of 32-key block b hold (KeyOfSlot:
//     2 t, 2 t + 1, 8 + 2 t, 9 + 2 t), transposes the bytes in registers and
//     stores one word per channel, a warp 128 contiguous bytes of a V^T row.
//   K: four 8-element chunks a thread, 256 apart.
//   Q: a half warp per (row, head), four of them 16 apart; the scale from
//     the half warp's maximum.
__global__ void __launch_bounds__(256) QuantizeAllKernel(
    const bf16* q, const bf16* k, const bf16* v, int64_t q_rows, int64_t kv_rows, int heads,
    QuantizeBlocks blocks, const float* k_scale, const float* v_scale, uint8_t* q8, uint8_t* k8,
    uint8_t* vt8, float* q_scale, int64_t vt_cols) {
  const int64_t cols = static_cast<int64_t>(heads) * 128;
  int64_t b = blockIdx.x;
  if (b < blocks.vt) {
    const int head = static_cast<int>(b % heads);
    const int64_t key0 = (b / heads) * 128;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int t = lane & 3, half = (lane >> 2) & 1, blk = lane >> 3;
    const int64_t col = key0 + 32 * blk + 16 * half + 4 * t;  // the thread's first slot
    const int c0 = head * 128 + 16 * warp;
    uint4 raw[4][2];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t key = key0 + 32 * blk + KeyOfSlot(16 * half + 4 * t + u);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        raw[u][j] = key < kv_rows
                        ? *reinterpret_cast<const uint4*>(v + key * cols + c0 + 8 * j)
                        : make_uint4(0, 0, 0, 0);
      }
    }
    float inv[16];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float4 s = reinterpret_cast<const float4*>(v_scale + c0)[j];
      inv[4 * j] = InversePow2(s.x);
      inv[4 * j + 1] = InversePow2(s.y);
      inv[4 * j + 2] = InversePow2(s.z);
      inv[4 * j + 3] = InversePow2(s.w);
    }
    uint32_t w[4][4];  // [channel group of 4][key u]
#pragma unroll
    for (int u = 0; u < 4; ++u) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float f[8];
        Bf16x8(raw[u][j], f);
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          const int c = 8 * j + 4 * g;
          w[2 * j + g][u] = E4m3x2(f[4 * g] * inv[c], f[4 * g + 1] * inv[c + 1]) |
                            (E4m3x2(f[4 * g + 2] * inv[c + 2], f[4 * g + 3] * inv[c + 3]) << 16);
        }
      }
    }
    if (col >= vt_cols) return;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      uint32_t o[4];
      Transpose4x4(w[g], o);
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        *reinterpret_cast<uint32_t*>(vt8 + (c0 + 4 * g + cc) * vt_cols + col) = o[cc];
      }
    }
    return;
  }
  b -= blocks.vt;
  if (b < blocks.k) {
    const int64_t n8 = kv_rows * cols / 8;
    const int64_t i0 = b * (QuantizeBlocks::kKElems / 8) + threadIdx.x;
    uint4 raw[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (i0 + 256 * u < n8) raw[u] = reinterpret_cast<const uint4*>(k)[i0 + 256 * u];
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t i = i0 + 256 * u;
      if (i >= n8) break;
      float x[8];
      Bf16x8(raw[u], x);
      const int c0 = static_cast<int>((i * 8) % cols);
      uint32_t wd[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float4 s = *reinterpret_cast<const float4*>(k_scale + c0 + 4 * j);
        wd[j] = E4m3x2(x[4 * j] * InversePow2(s.x), x[4 * j + 1] * InversePow2(s.y)) |
                (E4m3x2(x[4 * j + 2] * InversePow2(s.z), x[4 * j + 3] * InversePow2(s.w)) << 16);
      }
      reinterpret_cast<uint2*>(k8)[i] = make_uint2(wd[0], wd[1]);
    }
    return;
  }
  b -= blocks.k;
  const int64_t rows_heads = q_rows * heads;
  const int lane16 = threadIdx.x % 16;
  const int64_t rh0 = b * QuantizeBlocks::kQRowHeads + threadIdx.x / 16;
  uint4 raw[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int64_t rh = rh0 + 16 * u;
    raw[u] = rh < rows_heads ? reinterpret_cast<const uint4*>(q + rh * 128)[lane16]
                             : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int64_t rh = rh0 + 16 * u;
    const int head = static_cast<int>(rh % heads);
    float x[8];
    Bf16x8(raw[u], x);
    const float* ks = k_scale + head * 128 + 8 * lane16;
    const float4 s0 = reinterpret_cast<const float4*>(ks)[0];
    const float4 s1 = reinterpret_cast<const float4*>(ks)[1];
    x[0] *= s0.x, x[1] *= s0.y, x[2] *= s0.z, x[3] *= s0.w;
    x[4] *= s1.x, x[5] *= s1.y, x[6] *= s1.z, x[7] *= s1.w;
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(x[i]));
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (rh >= rows_heads) continue;
    const float scale = Fp8Scale(m), inv = InversePow2(scale);
    reinterpret_cast<uint2*>(q8 + rh * 128)[lane16] =
        make_uint2(E4m3x2(x[0] * inv, x[1] * inv) | (E4m3x2(x[2] * inv, x[3] * inv) << 16),
                   E4m3x2(x[4] * inv, x[5] * inv) | (E4m3x2(x[6] * inv, x[7] * inv) << 16));
    if (lane16 == 0) q_scale[rh] = scale;
  }
}

// ---- Forward configuration and shared memory. ----
// kKeyCols: keys per K/V tile (128, or 192: fewer per-tile steps for the
// same work; V^T then loads as 64-key boxes, 64-byte swizzled).
template <int kKeyCols>
struct Fp8Config {
  static constexpr int D = 128;
  static constexpr int kRows = 128;  // query rows per tile (64 per consumer)
  static constexpr int kKeys = kKeyCols;
  static_assert(kKeys == 128 || kKeys == 192, "key tile");
  static constexpr bool kVt64 = kKeys != 128;  // V^T as 64-key, 64-byte-swizzled boxes
  static constexpr int kStages = 3;  // of each ring: Q, K and V^T
  static constexpr int kTileBytes = kRows * D;  // a Q tile, one byte an element
  static constexpr int kKvBytes = kKeys * D;    // a K or a V^T tile
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kStages * kTileBytes;
  static constexpr int kV = kK + kStages * kKvBytes;
  static constexpr int kBars = kV + kStages * kKvBytes;
  static constexpr int kSmemBytes = kBars + 256 + 1024;
  static constexpr int kCtaThreads = 3 * kWgThreads;
  static constexpr int kFullArrivals = 1;  // the TMA thread's expect_tx
  // The 32-key alignment of ItemKeyTiles adds at most 31 keys.
  static constexpr int kKeyAlign = 32;
  // How far (log2) a row's maximum may grow past m before m moves: P stays
  // below 256 * 2^kLazyMax = 362 < 448, e4m3's largest finite value.
  static constexpr float kLazyMax = 0.5f;
  static_assert(6 * kStages * 8 <= 256, "the barriers fit their 256 bytes");
  static_assert(kStages * kKeys >= kWgmmaResidentKeys + kKeyAlign - 1,
                "a grouped item's aligned K/V tiles fit the rings");
};

// An item's K/V tiles: `count` tiles of kRows keys from key `first` of the
// sequence (first <= inner_begin, possibly negative), chosen so that the
// tensor-wide key k_start + first is a multiple of kKeyAlign (the file
// comment says why); none when the item sees no key.
struct KeyTiles {
  int first, count;
};
template <class C>
__device__ __forceinline__ KeyTiles ItemKeyTiles(const WorkItem& it) {
  if (it.inner_end <= it.inner_begin) return {it.inner_begin, 0};
  const int first = it.inner_begin - static_cast<int>((it.k_start + it.inner_begin) %
                                                      C::kKeyAlign);
  return {first, (it.inner_end - first + C::kKeys - 1) / C::kKeys};
}
static_assert(kForwardTileRows == Fp8Config<128>::kRows, "the planner's forward tiles are 128 rows");

template <int kBytes>
__device__ __forceinline__ void ExpectTile(uint32_t bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
               "n"(kBytes)
               : "memory");
}
// The K and V^T tiles of a ring stage.
template <class C>
__device__ __forceinline__ uint32_t KvTile(uint32_t ring, int stage) {
  return ring + stage * C::kKvBytes;
}
// A [128 columns x 128 rows] box of a 2D byte tensor (V^T): column, row.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int col, int row,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(bar)
      : "memory");
}

// ---- Producer (warpgroup 2; one thread issues every copy). ----
template <class C>
__device__ __forceinline__ void Fp8Producer(const KernelParams& p, const FwdSmem<C>& sm,
                                            const CUtensorMap& q_map, const CUtensorMap& k_map,
                                            const CUtensorMap& vt_map, int tid,
                                            const TileScheduler& sched) {
  ProducerRegs();
  if (tid != 0) return;
  int kv_iter = 0, q_iter = 0;
  for (int w = sched.First(); sched.Valid(w); w = sched.Next(w)) {
    const WorkItem it = ItemAt(p, w);
    const KeyTiles kt = ItemKeyTiles<C>(it);
    for (int j = 0; j < it.q_tiles; ++j, ++q_iter) {
      const RingPos<C::kStages> qp(q_iter);
      BarWait(sm.q_empty + 8 * qp.stage, qp.phase ^ 1);
      ExpectTile<C::kTileBytes>(sm.q_full + 8 * qp.stage);
      TmaLoadBlock(sm.Tile(sm.q, qp.stage), &q_map, 0, it.head,
                   static_cast<int>(it.q_start + it.tile_row + j * C::kRows),
                   sm.q_full + 8 * qp.stage);
      if (j > 0) continue;
      for (int n = 0; n < kt.count; ++n, ++kv_iter) {
        const RingPos<C::kStages> kp(kv_iter);
        const int key = static_cast<int>(it.k_start + kt.first + n * C::kKeys);
        BarWait(sm.k_empty + 8 * kp.stage, kp.phase ^ 1);
        ExpectTile<C::kKvBytes>(sm.k_full + 8 * kp.stage);
        TmaLoadBlock(KvTile<C>(sm.k, kp.stage), &k_map, 0, it.head, key,
                     sm.k_full + 8 * kp.stage);
        BarWait(sm.v_empty + 8 * kp.stage, kp.phase ^ 1);
        ExpectTile<C::kKvBytes>(sm.v_full + 8 * kp.stage);
        if constexpr (C::kVt64) {
#pragma unroll
          for (int b = 0; b < C::kKeys / 64; ++b) {
            TmaLoad2d(KvTile<C>(sm.v, kp.stage) + b * 64 * C::D, &vt_map, key + 64 * b,
                      it.head * C::D, sm.v_full + 8 * kp.stage);
          }
        } else {
          TmaLoad2d(KvTile<C>(sm.v, kp.stage), &vt_map, key, it.head * C::D,
                    sm.v_full + 8 * kp.stage);
        }
      }
    }
  }
}

// ---- Consumers. ----
template <int N>
struct Fp8Regs {
  float o[16][4];      // 64 rows x 128 output columns
  float sc[N / 8][4];  // 64 rows x N keys: S, then P
  uint32_t pa[N / 32][4];  // P as e4m3 A fragments, N / 32 k32 steps
  float m[2], l[2], corr[2];
  float k_exp[2];  // log2(e) * scale * q_scale of the thread's two rows
};

struct Fp8Rows {
  uint32_t q_tile, q_rows;
  int wg_row0, row0, t;
  int my_turn, other_turn;
};

struct Fp8Step {
  int k_stage, k_phase, v_stage, v_phase, col0;
  bool release;
};

// A descriptor of a K-major tile of 64-byte rows, 64-byte swizzled (V^T's
// 64-key boxes): 8-row core-matrix groups 512 bytes apart.
__device__ __forceinline__ uint64_t Desc64(uint32_t addr) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<uint16_t>((addr & 0x3FFFF) >> 4);
  d.bitfield.leading_byte_offset_ = 1;
  d.bitfield.stride_byte_offset_ = static_cast<uint16_t>(512 >> 4);
  d.bitfield.layout_type_ = static_cast<uint8_t>(GMMA::LayoutType::B64);
  return d.desc_;
}

template <int N>
using Fp8SsAtom = std::conditional_t<N == 128, GMMA::MMA_64x128x32_F32E4M3E4M3_SS_TN<>,
                                     GMMA::MMA_64x192x32_F32E4M3E4M3_SS_TN<>>;

// acc[64 x N] = A[64 x 128] B[N x 128]^T, both e4m3 K-major tiles of one
// 128-byte column block: four k32 steps, 32 bytes apart.
template <int N>
__device__ __forceinline__ void GemmFp8SS(float (&acc)[N / 8][4], uint32_t a, uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    detail::FmaSS<Fp8SsAtom<N>, N>(
        acc, Desc(a + kk * 32, 16, 1024), Desc(b + kk * 32, 16, 1024),
        kk > 0 ? GMMA::ScaleOut::One : GMMA::ScaleOut::Zero, std::make_index_sequence<N / 2>{});
  }
}
// acc[64 x 128] += P[64 x N keys] (registers) V^T[128 x N keys]^T: V^T one
// 128-byte-swizzled block, or (kVt64) N / 64 blocks of 64-byte rows.
template <class C>
__device__ __forceinline__ void GemmFp8RS(float (&acc)[16][4],
                                          const uint32_t (&pa)[C::kKeys / 32][4], uint32_t vt) {
#pragma unroll
  for (int kk = 0; kk < C::kKeys / 32; ++kk) {
    const uint64_t b = C::kVt64 ? Desc64(vt + (kk >> 1) * 64 * C::D + (kk & 1) * 32)
                                : Desc(vt + kk * 32, 16, 1024);
    detail::FmaRS<GMMA::MMA_64x128x32_F32E4M3E4M3_RS_TN<>, 128>(
        acc, pa[kk], b, std::make_index_sequence<64>{});
  }
}

// The online softmax step of one 64 x 128 score tile, raw scores in, P * 256
// out (see the file comment): the mask where the tile is not fully
// visible (always where it starts before the sequence's key 0), the row max
// and sum, corr for the output so far.
template <class C>
__device__ __forceinline__ void Fp8Probs(const KernelParams& p, const WorkItem& it,
                                         Fp8Regs<C::kKeys>& r, const Fp8Rows& at, int col0) {
  constexpr int NT = C::kKeys / 8;
  const TileClass cls =
      col0 < 0 ? kTilePartial
               : ClassOf(p, it.q_len, it.k_len, at.wg_row0, 64, col0, C::kKeys);
  if (cls != kTileFull) {
    int lo[2], hi[2], lo_rel[2], hi_rel[2];
    RowKeyRanges(p, it.q_len, it.k_len, at.row0, lo, hi);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      lo_rel[i] = lo[i] - col0 - 2 * at.t;
      hi_rel[i] = hi[i] - col0 - 2 * at.t;
    }
    HideScores(r.sc, lo_rel, hi_rel, -INFINITY);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    // The row maximum as a tree and the row sum in two parts: shorter
    // dependency chains than one running max and sum (measured: the kernel
    // 2.143 against 2.222 ms unmasked, bench/RESULTS.md).
    float a[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      a[j] = fmaxf(fmaxf(fmaxf(r.sc[j][2 * i], r.sc[j][2 * i + 1]),
                         fmaxf(r.sc[j + 4][2 * i], r.sc[j + 4][2 * i + 1])),
                   fmaxf(fmaxf(r.sc[j + 8][2 * i], r.sc[j + 8][2 * i + 1]),
                         fmaxf(r.sc[j + 12][2 * i], r.sc[j + 12][2 * i + 1])));
      if constexpr (NT == 24) {
        a[j] = fmaxf(a[j], fmaxf(fmaxf(r.sc[j + 16][2 * i], r.sc[j + 16][2 * i + 1]),
                                 fmaxf(r.sc[j + 20][2 * i], r.sc[j + 20][2 * i + 1])));
      }
    }
    const float mx = fmaxf(fmaxf(a[0], a[1]), fmaxf(a[2], a[3]));
    const float m_tile = QuadMax(mx) * r.k_exp[i];
    const float m_new = m_tile > r.m[i] + C::kLazyMax ? m_tile : r.m[i];
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    r.corr[i] = Exp2(r.m[i] - m_use);
    r.m[i] = m_new;
    const float shift = 8.f - m_use;  // P * 256
    float part[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      r.sc[nt][2 * i] = Exp2(fmaf(r.sc[nt][2 * i], r.k_exp[i], shift));
      r.sc[nt][2 * i + 1] = Exp2(fmaf(r.sc[nt][2 * i + 1], r.k_exp[i], shift));
      part[nt & 1] += r.sc[nt][2 * i] + r.sc[nt][2 * i + 1];
    }
    r.l[i] = fmaf(r.l[i], r.corr[i], part[0] + part[1]);
  }
}

// P (fp32 accumulator layout) into e4m3 A fragments, in place: V^T's
// permuted key blocks make the thread's accumulator columns 8 q + 2 t, + 1
// of k step kk the fragment's k indices 4 t .. 4 t + 3 (q = 0, 1) and
// 16 + 4 t .. 16 + 4 t + 3 (q = 2, 3) of rows g (i = 0) and g + 8 (i = 1).
template <int N>
__device__ __forceinline__ void PackP(const float (&sc)[N / 8][4], uint32_t (&pa)[N / 32][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 32; ++kk) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float(&a)[4] = sc[4 * kk + 2 * h];
        const float(&b)[4] = sc[4 * kk + 2 * h + 1];
        pa[kk][2 * h + i] = E4m3x2(a[2 * i], a[2 * i + 1]) | (E4m3x2(b[2 * i], b[2 * i + 1]) << 16);
      }
    }
  }
}

// One main-loop step: S_n (kS) and P_{n-1} V_{n-1} (kPv) issued in this
// warpgroup's turn, then S_n into P_n (while the P V runs), the output
// rescaled, P_n packed. As MainloopStep of cuda_wgmma.cu.
template <class C, bool kS, bool kPv>
__device__ __forceinline__ void Fp8MainloopStep(const KernelParams& p, const WorkItem& it,
                                                const FwdSmem<C>& sm, Fp8Regs<C::kKeys>& r,
                                                const Fp8Rows& at, const Fp8Step& st) {
  if (kS) BarWait(sm.k_full + 8 * st.k_stage, st.k_phase);
  if (kPv) BarWait(sm.v_full + 8 * st.v_stage, st.v_phase);
  TurnWait(p, at.my_turn);
  if constexpr (kPv) {
    FenceRegs(r.pa);
    FenceRegs(r.o);
  }
  WgFence();
  if constexpr (kS) {
    GemmFp8SS<C::kKeys>(r.sc, at.q_rows, KvTile<C>(sm.k, st.k_stage));
    WgCommit();
  }
  if constexpr (kPv) {
    GemmFp8RS<C>(r.o, r.pa, KvTile<C>(sm.v, st.v_stage));
    WgCommit();
  }
  TurnPass(p, at.other_turn);
  if constexpr (kS && kPv) {
    WgWait1();
    FenceRegs(r.sc);
    if (st.release) BarArrive(sm.k_empty + 8 * st.k_stage);
    Fp8Probs<C>(p, it, r, at, st.col0);
  }
  WgWait0();
  if constexpr (kPv) {
    FenceRegs(r.o);
    FenceRegs(r.pa);
    if (st.release) BarArrive(sm.v_empty + 8 * st.v_stage);
  }
  if constexpr (kS) {
    FenceRegs(r.sc);
    if constexpr (!kPv) {
      if (st.release) BarArrive(sm.k_empty + 8 * st.k_stage);
      Fp8Probs<C>(p, it, r, at, st.col0);
    } else if (__any_sync(0xffffffffu, r.corr[0] != 1.f || r.corr[1] != 1.f)) {
#pragma unroll
      for (int dt = 0; dt < 16; ++dt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) r.o[dt][e] *= r.corr[e >> 1];
      }
    }
    PackP<C::kKeys>(r.sc, r.pa);
  }
}

// The epilogue: 1 / sum per row, the log-sum-exp (the quad's first thread),
// and the output rows scaled by V's channel scales, as bf16.
template <class C>
__device__ __forceinline__ void Fp8Epilogue(const KernelParams& p, const WorkItem& it,
                                            const Fp8Regs<C::kKeys>& r, const Fp8Rows& at) {
  float mul[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float sum = QuadSum(r.l[i]);
    const bool seen = sum > 0.f;  // Else the row saw no key.
    mul[i] = seen ? 1.f / sum : 0.f;
    const int row = at.row0 + 8 * i;
    if (at.t == 0 && row < it.q_len) {
      p.lse[(it.q_start + row) * p.heads + it.head] =
          seen ? (r.m[i] + log2f(sum) - 8.f) * kLn2 : -INFINITY;
    }
  }
  const float* vs = p.v_scale + it.head * C::D + 2 * at.t;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = at.row0 + 8 * i;
    if (row >= it.q_len) break;
    bf16* out = static_cast<bf16*>(p.o) + ((it.q_start + row) * p.heads + it.head) * C::D +
                2 * at.t;
#pragma unroll
    for (int dt = 0; dt < 16; ++dt) {
      const float2 s = *reinterpret_cast<const float2*>(vs + 8 * dt);
      *reinterpret_cast<__nv_bfloat162*>(out + 8 * dt) = __floats2bfloat162_rn(
          r.o[dt][2 * i] * mul[i] * s.x, r.o[dt][2 * i + 1] * mul[i] * s.y);
    }
  }
}

template <class C>
__device__ __forceinline__ void Fp8Consumer(const KernelParams& p, const FwdSmem<C>& sm, int c,
                                            int tid, const TileScheduler& sched) {
  ConsumerRegs();
  Fp8Rows at{};
  at.my_turn = 1 + c;
  at.other_turn = 2 - c;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2;
  at.t = lane & 3;
  const int row_in_tile = c * 64 + warp * 16 + g;
  if (c == 1) TurnPass(p, 1);  // warpgroup 0 issues first
  Fp8Regs<C::kKeys> r;
  const float k_exp = p.scale * kLog2e;
  int kv_iter = 0, q_iter = 0;
  for (int w = sched.First(); sched.Valid(w); w = sched.Next(w)) {
    WorkItem it = ItemAt(p, w);
    const KeyTiles kt = ItemKeyTiles<C>(it);
    const int kv_first = kv_iter;
    for (int j = 0; j < it.q_tiles; ++j, ++q_iter, it.tile_row += C::kRows) {
      kv_iter = kv_first;
      at.row0 = it.tile_row + row_in_tile;
      at.wg_row0 = it.tile_row + 64 * c;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = at.row0 + 8 * i;
        r.m[i] = -INFINITY;
        r.l[i] = 0.f;
        r.k_exp[i] =
            k_exp * (row < it.q_len ? p.q_scale[(it.q_start + row) * p.heads + it.head] : 1.f);
      }
#pragma unroll
      for (int dt = 0; dt < 16; ++dt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) r.o[dt][e] = 0.f;
      }
      const RingPos<C::kStages> qp(q_iter);
      BarWait(sm.q_full + 8 * qp.stage, qp.phase);
      at.q_tile = sm.Tile(sm.q, qp.stage);
      at.q_rows = at.q_tile + c * 64 * 128;
      if (kt.count > 0) {
        Fp8Step st{};
        st.release = j + 1 == it.q_tiles;
        RingPos<C::kStages> kp(kv_iter);
        st.k_stage = kp.stage;
        st.k_phase = kp.phase;
        st.col0 = kt.first;
        Fp8MainloopStep<C, true, false>(p, it, sm, r, at, st);
        for (int n = 1; n < kt.count; ++n) {
          st.v_stage = kp.stage;
          st.v_phase = kp.phase;
          kp = RingPos<C::kStages>(++kv_iter);
          st.k_stage = kp.stage;
          st.k_phase = kp.phase;
          st.col0 = kt.first + n * C::kKeys;
          Fp8MainloopStep<C, true, true>(p, it, sm, r, at, st);
        }
        st.v_stage = kp.stage;
        st.v_phase = kp.phase;
        Fp8MainloopStep<C, false, true>(p, it, sm, r, at, st);
        ++kv_iter;
      }
      BarArrive(sm.q_empty + 8 * qp.stage);
      Fp8Epilogue<C>(p, it, r, at);
    }
  }
  if (c == 0) TurnWait(p, at.my_turn);
}

template <class C>
__global__ void __launch_bounds__(C::kCtaThreads, 1)
    Fp8ForwardKernel(const KernelParams p, const __grid_constant__ CUtensorMap q_map,
                     const __grid_constant__ CUtensorMap k_map,
                     const __grid_constant__ CUtensorMap vt_map) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const FwdSmem<C> sm((raw + 1023) & ~1023u);
  const int wg = threadIdx.x / kWgThreads, tid = threadIdx.x % kWgThreads;
  const TileScheduler sched(p);
  if (threadIdx.x == 0) sm.Init();
  __syncthreads();
  if (wg == 2) {
    Fp8Producer<C>(p, sm, q_map, k_map, vt_map, tid, sched);
  } else {
    Fp8Consumer<C>(p, sm, wg, tid, sched);
  }
}

// Tensor maps over the e4m3 operands, 128-byte swizzled 128 x 128-byte
// boxes: q8/k8 [rows, heads, 128] (coordinates column, head, row) and V^T
// [heads * 128, vt_cols] (column = key, row).
bool MakeRowsMap(CUtensorMap* map, const void* base, int64_t rows, int heads, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr || rows <= 0 || rows > INT32_MAX) return false;
  const cuuint64_t dims[3] = {128, static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {128, static_cast<cuuint64_t>(heads) * 128};
  const cuuint32_t box[3] = {128, 1, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(base), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
// box_keys 128 (128-byte swizzle) or 64 (64-byte swizzle).
bool MakeVtMap(CUtensorMap* map, const void* base, int64_t vt_cols, int heads, int box_keys) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr || vt_cols <= 0 || vt_cols > INT32_MAX || vt_cols % 16 != 0) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(vt_cols),
                              static_cast<cuuint64_t>(heads) * 128};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(vt_cols)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_keys), 128};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                box_keys == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <class C>
int LaunchFp8Kernel(const KernelParams& p, int sms, cudaStream_t stream) {
  CUtensorMap q_map{}, k_map{}, vt_map{};
  if (!MakeRowsMap(&q_map, p.q, p.q_rows, p.heads, C::kRows) ||
      !MakeRowsMap(&k_map, p.k, p.kv_rows, p.heads, C::kKeys) ||
      !MakeVtMap(&vt_map, p.v, p.vt_cols, p.heads, C::kVt64 ? 64 : 128)) {
    return cudaErrorNotSupported;
  }
  auto kernel = Fp8ForwardKernel<C>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       C::kSmemBytes);
  if (e != cudaSuccess) return e;
  kernel<<<TileScheduler::Grid(p, sms), C::kCtaThreads, C::kSmemBytes, stream>>>(p, q_map, k_map,
                                                                                vt_map);
  return cudaGetLastError();
}

}  // namespace

int LaunchFp8Quantize(const void* q, const void* k, const void* v, int64_t q_rows,
                      int64_t kv_rows, int heads, int head_dim, const Fp8Operands& ops,
                      void* stream) {
  if (head_dim != 128) return cudaErrorInvalidValue;
  auto s = static_cast<cudaStream_t>(stream);
  const int cols = heads * 128;
  uint32_t* k_amax = ops.amax;  // Then V's: amax[cols .. 2 cols).
  if (kv_rows > 0) {
    // About eight blocks per SM over both tensors, each thread at least
    // four rows.
    const int col_blocks = (cols + 255) / 256;
    const dim3 grid(col_blocks,
                    static_cast<unsigned>(std::max<int64_t>(
                        1, std::min<int64_t>((kv_rows + 31) / 32, 1024 / col_blocks))),
                    2);
    ChannelAmaxKernel<<<grid, 256, 0, s>>>(static_cast<const bf16*>(k),
                                           static_cast<const bf16*>(v), kv_rows, cols, k_amax);
  }
  // The scales, then Q, K and V^T in one launch.
  ScalesBothKernel<<<(2 * cols + 255) / 256, 256, 0, s>>>(ops.amax, cols, ops.k_scale, ops.v_scale);
  const QuantizeBlocks blocks(q_rows, kv_rows, heads, ops.vt_cols);
  const int64_t grid = blocks.vt + blocks.k + blocks.q;
  if (grid > 0) {
    QuantizeAllKernel<<<static_cast<unsigned>(grid), 256, 0, s>>>(
        static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
        q_rows, kv_rows, heads, blocks, ops.k_scale, ops.v_scale, static_cast<uint8_t*>(ops.q8),
        static_cast<uint8_t*>(ops.k8), static_cast<uint8_t*>(ops.vt8), ops.q_scale, ops.vt_cols);
  }
  return cudaGetLastError();
}

bool Fp8ForwardSupports(const KernelParams& p) {
  return p.head_dim == 128 && p.activation == kActSoftmax && p.bias == nullptr && !p.rope &&
         p.scale > 0.f;
}

int LaunchJaggedForwardFp8(const KernelParams& p, int sms, void* stream) {
  if (p.num_items * p.heads == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  return p.fp8_wide_keys ? LaunchFp8Kernel<Fp8Config<192>>(p, sms, s)
                         : LaunchFp8Kernel<Fp8Config<128>>(p, sms, s);
}

}  // namespace recfleet::attention::cuda_impl
