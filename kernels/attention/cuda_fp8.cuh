// FP8 (e4m3) pieces shared by the Hopper FP8 attention forward
// (cuda_wgmma_fp8.cu) and backward (cuda_wgmma_fp8_bwd.cu): power-of-two
// scales from exponent bits, e4m3 conversions, the quantize pre-passes'
// building blocks (per-channel amax, per-channel and per-token quantization,
// the transposed and key-permuted copies the P V-type GEMMs read), TMA and
// wgmma helpers for e4m3 tiles, and the accumulator-to-A-fragment packing.
//
// Transposed copies ([heads * 128, cols] per tensor, "X^T"): wgmma with
// 8-bit operands reads both shared-memory operands K-major, so a GEMM that
// reduces over tokens (P V, dS^T Q, P^T dO, dS K) reads the token-major
// operand as X^T, whose tokens are permuted inside each 32-token block
// (KeyOfSlot) so that an fp32 accumulator packs into e4m3 A fragments in
// place (PackP). Tiles of X^T therefore start at multiples of 32 tokens of
// the whole tensor.

#ifndef RECFLEET_KERNELS_ATTENTION_CUDA_FP8_CUH_
#define RECFLEET_KERNELS_ATTENTION_CUDA_FP8_CUH_

#include <cuda_fp8.h>

#include <algorithm>
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

// ChannelAmaxKernel's grid over [rows, cols] tensors: about eight blocks
// per SM over both tensors, each thread at least four rows.
inline dim3 ChannelAmaxGrid(int64_t rows, int cols) {
  const int col_blocks = (cols + 255) / 256;
  return dim3(col_blocks,
              static_cast<unsigned>(std::max<int64_t>(
                  1, std::min<int64_t>((rows + 31) / 32, 1024 / col_blocks))),
              2);
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

// 4 x 4 byte transpose: out[c] holds byte c of in[0..3], in order.
__device__ __forceinline__ void Transpose4x4(const uint32_t (&in)[4], uint32_t (&out)[4]) {
  const uint32_t a = __byte_perm(in[0], in[1], 0x5140), b = __byte_perm(in[2], in[3], 0x5140);
  const uint32_t c = __byte_perm(in[0], in[1], 0x7362), d = __byte_perm(in[2], in[3], 0x7362);
  out[0] = __byte_perm(a, b, 0x5410);
  out[1] = __byte_perm(a, b, 0x7632);
  out[2] = __byte_perm(c, d, 0x5410);
  out[3] = __byte_perm(c, d, 0x7632);
}

// The quantize blocks of 256 threads (QuantizeAllKernel and the backward's
// pre-pass run them, block b of its section each):
//   Transposed: x^T[h d + c, 32 b + s] = x[32 b + KeyOfSlot(s), h, c] /
//     scale[h, c] for 128 tokens x one head's 128 channels (tokens >= rows
//     zero, columns >= xt_cols not written). Warp w takes channels
//     16 w .. 16 w + 15 and the block's 128 tokens; lane t + 4 h + 8 b loads
//     the four tokens that slots 4 t .. 4 t + 3 of half h of 32-token block b
//     hold (KeyOfSlot: 2 t, 2 t + 1, 8 + 2 t, 9 + 2 t), transposes the bytes
//     in registers and stores one word per channel, a warp 128 contiguous
//     bytes of an x^T row.
//   Channels: x8 = x / scale[h, c] for 8192 elements, four 8-element chunks a
//     thread, 256 apart.
//   Tokens: x8[r, h, :] = x[r, h, :] * fold[h, :] / token_scale[r, h] for 64
//     (row, head) pairs, a half warp each, four of them 16 apart; the scale
//     from the half warp's maximum.
constexpr int kQuantChannelElems = 8192;
constexpr int kQuantTokenRowHeads = 64;
inline int64_t TransposedBlocks(int64_t xt_cols, int heads) { return (xt_cols + 127) / 128 * heads; }
inline int64_t ChannelBlocks(int64_t rows, int heads) {
  return (rows * heads * 128 + kQuantChannelElems - 1) / kQuantChannelElems;
}
inline int64_t TokenBlocks(int64_t rows, int heads) {
  return (rows * heads + kQuantTokenRowHeads - 1) / kQuantTokenRowHeads;
}

// QuantizeTransposedBlock's thread layout for block b: the head, the first
// token, the thread's channels c0 .. c0 + 15, its first x^T column and the
// block-relative tokens of its four loads (slots 4 t .. 4 t + 3 of half h
// of 32-token block blk).
struct TransposedLayout {
  int head, c0;
  int64_t key0, col;
  int token[4];
  __device__ __forceinline__ TransposedLayout(int heads, int64_t b) {
    head = static_cast<int>(b % heads);
    key0 = (b / heads) * 128;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int t = lane & 3, half = (lane >> 2) & 1, blk = lane >> 3;
    col = key0 + 32 * blk + 16 * half + 4 * t;
    c0 = head * 128 + 16 * warp;
#pragma unroll
    for (int u = 0; u < 4; ++u) token[u] = 32 * blk + KeyOfSlot(16 * half + 4 * t + u);
  }
};

// raw[u][j] = channels c0 + 8 j .. c0 + 8 j + 7 of token key0 + token[u]
// (zero at or past rows).
__device__ __forceinline__ void LoadTransposedTile(const bf16* x, int64_t rows, int heads,
                                                   const TransposedLayout& l, uint4 (&raw)[4][2]) {
  const int64_t cols = static_cast<int64_t>(heads) * 128;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int64_t key = l.key0 + l.token[u];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      raw[u][j] = key < rows ? *reinterpret_cast<const uint4*>(x + key * cols + l.c0 + 8 * j)
                             : make_uint4(0, 0, 0, 0);
    }
  }
}

// w[g][u] = e4m3 codes of channels c0 + 4 g .. c0 + 4 g + 3 of token u
// divided by scale[c] (one byte each, channel order).
__device__ __forceinline__ void ChannelCodes(const uint4 (&raw)[4][2], const float* scale,
                                             int c0, uint32_t (&w)[4][4]) {
  float inv[16];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float4 s = reinterpret_cast<const float4*>(scale + c0)[j];
    inv[4 * j] = InversePow2(s.x);
    inv[4 * j + 1] = InversePow2(s.y);
    inv[4 * j + 2] = InversePow2(s.z);
    inv[4 * j + 3] = InversePow2(s.w);
  }
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
}

// ChannelCodes' words as x^T: one word per channel, a warp 128 contiguous
// bytes of an x^T row (columns >= xt_cols not written).
__device__ __forceinline__ void StoreTransposedCodes(const uint32_t (&w)[4][4], uint8_t* xt8,
                                                     int64_t xt_cols, const TransposedLayout& l) {
  if (l.col >= xt_cols) return;
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    uint32_t o[4];
    Transpose4x4(w[g], o);
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
      *reinterpret_cast<uint32_t*>(xt8 + (l.c0 + 4 * g + cc) * xt_cols + l.col) = o[cc];
    }
  }
}

__device__ __forceinline__ void QuantizeTransposedBlock(const bf16* x, int64_t rows, int heads,
                                                        const float* scale, uint8_t* xt8,
                                                        int64_t xt_cols, int64_t b) {
  const TransposedLayout l(heads, b);
  uint4 raw[4][2];
  LoadTransposedTile(x, rows, heads, l, raw);
  uint32_t w[4][4];  // [channel group of 4][key u]
  ChannelCodes(raw, scale, l.c0, w);
  StoreTransposedCodes(w, xt8, xt_cols, l);
}

__device__ __forceinline__ void QuantizeChannelsBlock(const bf16* x, int64_t rows, int heads,
                                                      const float* scale, uint8_t* x8,
                                                      int64_t b) {
  const int64_t cols = static_cast<int64_t>(heads) * 128;
  const int64_t n8 = rows * cols / 8;
  const int64_t i0 = b * (kQuantChannelElems / 8) + threadIdx.x;
  uint4 raw[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    if (i0 + 256 * u < n8) raw[u] = reinterpret_cast<const uint4*>(x)[i0 + 256 * u];
  }
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int64_t i = i0 + 256 * u;
    if (i >= n8) break;
    float f[8];
    Bf16x8(raw[u], f);
    const int c0 = static_cast<int>((i * 8) % cols);
    uint32_t wd[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float4 s = *reinterpret_cast<const float4*>(scale + c0 + 4 * j);
      wd[j] = E4m3x2(f[4 * j] * InversePow2(s.x), f[4 * j + 1] * InversePow2(s.y)) |
              (E4m3x2(f[4 * j + 2] * InversePow2(s.z), f[4 * j + 3] * InversePow2(s.w)) << 16);
    }
    reinterpret_cast<uint2*>(x8)[i] = make_uint2(wd[0], wd[1]);
  }
}

// e4m3 rounding of x, as a float (the backward's rowsum(dO * O) operands).
__device__ __forceinline__ float E4m3Round(float x) {
  return static_cast<float>(__nv_fp8_e4m3(x));
}

__device__ __forceinline__ void QuantizeTokensBlock(const bf16* x, int64_t rows, int heads,
                                                    const float* fold, uint8_t* x8,
                                                    float* token_scale, int64_t b) {
  const int64_t rows_heads = rows * heads;
  const int lane16 = threadIdx.x % 16;
  const int64_t rh0 = b * kQuantTokenRowHeads + threadIdx.x / 16;
  uint4 raw[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int64_t rh = rh0 + 16 * u;
    raw[u] = rh < rows_heads ? reinterpret_cast<const uint4*>(x + rh * 128)[lane16]
                             : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int64_t rh = rh0 + 16 * u;
    const int head = static_cast<int>(rh % heads);
    float f[8];
    Bf16x8(raw[u], f);
    const float* ks = fold + head * 128 + 8 * lane16;
    const float4 s0 = reinterpret_cast<const float4*>(ks)[0];
    const float4 s1 = reinterpret_cast<const float4*>(ks)[1];
    f[0] *= s0.x, f[1] *= s0.y, f[2] *= s0.z, f[3] *= s0.w;
    f[4] *= s1.x, f[5] *= s1.y, f[6] *= s1.z, f[7] *= s1.w;
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(f[i]));
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float s = Fp8Scale(m), inv = InversePow2(s);
    if (rh >= rows_heads) continue;
    reinterpret_cast<uint2*>(x8 + rh * 128)[lane16] =
        make_uint2(E4m3x2(f[0] * inv, f[1] * inv) | (E4m3x2(f[2] * inv, f[3] * inv) << 16),
                   E4m3x2(f[4] * inv, f[5] * inv) | (E4m3x2(f[6] * inv, f[7] * inv) << 16));
    if (lane16 == 0) token_scale[rh] = s;
  }
}

// ---- Epilogues. ----
// The thread's 32 of a head's column scales col[0..127] (columns 8 dt + 2 t,
// + 1; t = lane % 4), for StoreScaledRows.
__device__ __forceinline__ void LoadColumnScales(const float* col, int t, float2 (&s)[16]) {
#pragma unroll
  for (int dt = 0; dt < 16; ++dt) s[dt] = *reinterpret_cast<const float2*>(col + 8 * dt + 2 * t);
}
// A thread's rows row0 and row0 + 8 of a 64 x 128 accumulator, times mul[r]
// and the column scales s (LoadColumnScales), as bf16 rows of dst [rows,
// heads, 128] from `start`; rows at or past len skipped (t = lane % 4).
// The scales are loaded before the first store: the compiler cannot tell
// them from `dst`, so loads placed after a store were issued after it and
// ran one after another (~8,000 cycles of the forward's epilogue on H200;
// bench/RESULTS.md).
__device__ __forceinline__ void StoreScaledRows(void* dst, const float (&acc)[16][4],
                                                int64_t start, int row0, int len, int head,
                                                int heads, const float (&mul)[2],
                                                const float2 (&s)[16], int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    if (row >= len) continue;
    bf16* out = static_cast<bf16*>(dst) + ((start + row) * heads + head) * 128 + 2 * t;
#pragma unroll
    for (int dt = 0; dt < 16; ++dt) {
      *reinterpret_cast<__nv_bfloat162*>(out + 8 * dt) = __floats2bfloat162_rn(
          acc[dt][2 * r] * mul[r] * s[dt].x, acc[dt][2 * r + 1] * mul[r] * s[dt].y);
    }
  }
}
// The same with the scales loaded here.
__device__ __forceinline__ void StoreScaledRows(void* dst, const float (&acc)[16][4],
                                                int64_t start, int row0, int len, int head,
                                                int heads, const float (&mul)[2],
                                                const float* col, int t) {
  float2 s[16];
  LoadColumnScales(col, t, s);
  StoreScaledRows(dst, acc, start, row0, len, head, heads, mul, s, t);
}

// ---- TMA and wgmma on e4m3 tiles. ----
template <int kBytes>
__device__ __forceinline__ void ExpectTile(uint32_t bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
               "n"(kBytes)
               : "memory");
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
using Fp8SsAtom = std::conditional_t<
    N == 64, GMMA::MMA_64x64x32_F32E4M3E4M3_SS_TN<>,
    std::conditional_t<N == 128, GMMA::MMA_64x128x32_F32E4M3E4M3_SS_TN<>,
                       GMMA::MMA_64x192x32_F32E4M3E4M3_SS_TN<>>>;

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

}  // namespace

// Tensor maps over e4m3 operands: rows [rows, heads, 128] (coordinates
// column, head, row; 128 x box_rows boxes, 128-byte swizzled) and X^T
// [heads * 128, cols] (coordinates column = token, row; box_keys x 128
// boxes, box_keys 128 (128-byte swizzle) or 64 (64-byte swizzle)). False if
// the tensor does not qualify or the encoder is unavailable.
bool MakeRowsMap(CUtensorMap* map, const void* base, int64_t rows, int heads, int box_rows);
bool MakeVtMap(CUtensorMap* map, const void* base, int64_t vt_cols, int heads, int box_keys);

}  // namespace recfleet::attention::cuda_impl

#endif  // RECFLEET_KERNELS_ATTENTION_CUDA_FP8_CUH_
