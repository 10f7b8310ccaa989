#include "kernels/quant/quantize_kernels.h"

#include <algorithm>
#include <type_traits>

#include "kernels/quant/cuda_util.h"
#include "kernels/quant/minifloat.h"

namespace recfleet::quant_cuda {
namespace {

using cuda_util::ElemType;
using cuda_util::LoadF;
using cuda_util::StoreF;

constexpr int kThreads = 256;  // Hadamard and elementwise kernels

// Quantization works on 128 x 128 tiles of x, one per block of 256 threads
// (8 warps). Thread (warp w, lane l) holds 4 groups of 4 consecutive rows,
// group i being rows 4 * (w + 8 i) .. + 3, and columns 4 l .. 4 l + 3: 64
// elements, all loaded before the first use (16 independent loads in
// flight per thread). A warp's load of one row is 128 consecutive elements.
constexpr int kTile = 128;
constexpr int kTileThreads = 256;
constexpr int kWarps = kTileThreads / 32;
// 128-point Hadamard over the tile's rows: 1 / sqrt(128).
constexpr float kHadamardNorm128 = 0.08838834764831845f;

using Tile = float[4][4][4];  // [group i][row rr in group][column j]

__device__ __forceinline__ uint8_t ToE8M0(float pow2) {
  int e;
  frexpf(pow2, &e);  // 2^p = 0.5 * 2^(p + 1)
  return static_cast<uint8_t>(e - 1 + 127);
}

__device__ __forceinline__ int64_t TileRow(int64_t r0, int warp, int i, int rr) {
  return r0 + 4 * (warp + kWarps * i) + rr;
}

// Loads the thread's 64 elements. For a whole tile, all 16 vector loads are
// issued before any of them is converted, so they are in flight together;
// edge tiles take guarded scalar loads.
template <typename T>
__device__ __forceinline__ void LoadTile(const QuantizeArgs& a, bool whole, int64_t r0,
                                         int64_t c, int warp, Tile& v) {
  const T* x = static_cast<const T*>(a.x);
  if (whole) {
    using Raw = typename std::conditional<sizeof(T) == 4, float4, uint2>::type;
    Raw raw[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int rr = 0; rr < 4; ++rr) {
        raw[i][rr] = __ldg(reinterpret_cast<const Raw*>(x + TileRow(r0, warp, i, rr) * a.cols + c));
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int rr = 0; rr < 4; ++rr) {
        if constexpr (sizeof(T) == 4) {
          const float4 f = raw[i][rr];
          v[i][rr][0] = f.x, v[i][rr][1] = f.y, v[i][rr][2] = f.z, v[i][rr][3] = f.w;
        } else {
          const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw[i][rr]);
          const float2 lo = __bfloat1622float2(h[0]), hi = __bfloat1622float2(h[1]);
          v[i][rr][0] = lo.x, v[i][rr][1] = lo.y, v[i][rr][2] = hi.x, v[i][rr][3] = hi.y;
        }
      }
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int64_t r = TileRow(r0, warp, i, rr);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[i][rr][j] =
            r < a.rows && c + j < a.cols ? cuda_util::ToFloat(x[r * a.cols + c + j]) : 0.0f;
      }
    }
  }
}

// Dequantization scales of the thread's elements for x-oriented blocks of
// XR x XC (1x128: one per row; 128x1: one per column; 128x128: one; 32x32:
// one per row group i). Every thread of the block must call it.
template <int XR, int XC>
struct TileScales {
  static constexpr int kCount = XR == 1 ? 16 : (XC == 1 ? 4 : (XR == 32 ? 4 : 1));
  float s[kCount];
  __device__ __forceinline__ static int Index(int i, int rr, int j) {
    if constexpr (XR == 1) return i * 4 + rr;
    if constexpr (XC == 1) return j;
    if constexpr (XR == 32) return i;
    return 0;
  }
  __device__ __forceinline__ void Compute(const Tile& v, float (*red)[kTile], float fmax,
                                          bool pow2, int warp, int lane) {
    if constexpr (XR == 1) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int rr = 0; rr < 4; ++rr) {
          float m = fmaxf(fmaxf(fabsf(v[i][rr][0]), fabsf(v[i][rr][1])),
                          fmaxf(fabsf(v[i][rr][2]), fabsf(v[i][rr][3])));
          s[i * 4 + rr] = minifloat::BlockScale(cuda_util::WarpMax(m), fmax, pow2);
        }
      }
    } else if constexpr (XC == 1) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float m = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int rr = 0; rr < 4; ++rr) m = fmaxf(m, fabsf(v[i][rr][j]));
        }
        red[warp][lane * 4 + j] = m;
      }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float m = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) m = fmaxf(m, red[w][lane * 4 + j]);
        s[j] = minifloat::BlockScale(m, fmax, pow2);
      }
    } else {
      // Square blocks: XR = 128 (one per tile) or 32 (row block i, column
      // block lane / 8; lanes of one column block differ in bits 0-2).
      constexpr int kGroups = XR == 32 ? 4 : 1;
      float m[kGroups];
#pragma unroll
      for (int g = 0; g < kGroups; ++g) m[g] = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int rr = 0; rr < 4; ++rr) {
#pragma unroll
          for (int j = 0; j < 4; ++j) m[XR == 32 ? i : 0] = fmaxf(m[XR == 32 ? i : 0], fabsf(v[i][rr][j]));
        }
      }
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
#pragma unroll
        for (int o = 1; o < (XR == 32 ? 8 : 32); o <<= 1) {
          m[g] = fmaxf(m[g], __shfl_xor_sync(0xffffffffu, m[g], o));
        }
        red[warp][g * 4 + lane / 8] = m[g];
      }
      __syncthreads();
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        float t = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) t = fmaxf(t, red[w][g * 4 + (XR == 32 ? lane / 8 : 0)]);
        s[g] = minifloat::BlockScale(t, fmax, pow2);
      }
    }
  }
};

// Writes the scale of q-block (bi, bj) of one output.
__device__ __forceinline__ void WriteScale(const QuantizeTarget& t, int64_t bi, int64_t bj,
                                           float s) {
  const int64_t idx = bi * t.scale_stride_row + bj * t.scale_stride_col;
  if (t.e8m0 != nullptr) {
    t.e8m0[idx] = ToE8M0(s);
  } else {
    t.scales[idx] = s;
  }
}

// Encodes the thread's elements for one output: word[i][rr] holds the four
// bytes of row (i, rr), column j in byte j. Stochastic rounding draws from
// the element's index in that output (x's for direct, x^T's for transposed),
// as the CPU reference does.
template <int XR, int XC, bool kT, bool kSR>
__device__ __forceinline__ void Encode(const QuantizeArgs& a, const QuantizeTarget& t,
                                       const Tile& v, const TileScales<XR, XC>& sc, int64_t r0,
                                       int64_t c, int warp, uint32_t (&word)[4][4]) {
  const minifloat::Spec spec = a.format == 2 ? minifloat::E5M2() : minifloat::E4M3();
  float inv[TileScales<XR, XC>::kCount];
#pragma unroll
  for (int k = 0; k < TileScales<XR, XC>::kCount; ++k) {
    inv[k] = __frcp_rn(sc.s[k]);  // correctly rounded, as minifloat::Reciprocal on the host
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      uint32_t w = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float x = v[i][rr][j] * inv[TileScales<XR, XC>::Index(i, rr, j)];
        uint32_t b;
        if (kSR && t.stochastic) {
          const int64_t r = TileRow(r0, warp, i, rr), cc = c + j;
          const uint64_t k = kT ? static_cast<uint64_t>(cc * a.rows + r)
                                : static_cast<uint64_t>(r * a.cols + cc);
          b = minifloat::EncodeStochastic(spec, x, minifloat::UniformFromCounter(t.seed, k));
        } else {
          b = minifloat::Encode(spec, x);
        }
        w |= b << (8 * j);
      }
      word[i][rr] = w;
    }
  }
}

__device__ __forceinline__ void StoreDirect(const QuantizeArgs& a, const QuantizeTarget& t,
                                            const uint32_t (&word)[4][4], int64_t r0, int64_t c,
                                            int warp) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int64_t r = TileRow(r0, warp, i, rr);
      if (r >= a.rows) continue;
      uint8_t* out = t.q + r * a.cols + c;
      if (a.cols % 4 == 0 && c + 3 < a.cols) {
        *reinterpret_cast<uint32_t*>(out) = word[i][rr];
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (c + j < a.cols) out[j] = static_cast<uint8_t>(word[i][rr] >> (8 * j));
        }
      }
    }
  }
}

// Transposed store through shared memory: each thread turns its 4 x 4 byte
// blocks around in registers and writes 32-bit words of q^T rows (4 x rows
// each) into a 128 x 32-word tile, swizzled (word index XOR the writer's
// lane) so that both the writes and the row-wise reads hit 32 distinct
// banks; each warp then writes whole 128-byte rows of q.
__device__ __forceinline__ void StoreTransposed(const QuantizeArgs& a, const QuantizeTarget& t,
                                                const uint32_t (&word)[4][4], uint32_t* sm,
                                                int64_t r0, int64_t c0, int warp, int lane) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t t0 = __byte_perm(word[i][0], word[i][1], 0x5140);
    const uint32_t t1 = __byte_perm(word[i][2], word[i][3], 0x5140);
    const uint32_t t2 = __byte_perm(word[i][0], word[i][1], 0x7362);
    const uint32_t t3 = __byte_perm(word[i][2], word[i][3], 0x7362);
    const uint32_t col[4] = {__byte_perm(t0, t1, 0x5410), __byte_perm(t0, t1, 0x7632),
                             __byte_perm(t2, t3, 0x5410), __byte_perm(t2, t3, 0x7632)};
    const int g = warp + kWarps * i;  // word index within a q row
#pragma unroll
    for (int j = 0; j < 4; ++j) sm[(lane * 4 + j) * 32 + (g ^ lane)] = col[j];
  }
  __syncthreads();
#pragma unroll 4
  for (int k = 0; k < kTile / kWarps; ++k) {
    const int cc = warp * (kTile / kWarps) + k;  // tile column = q row
    const int64_t qr = c0 + cc, qc = r0 + 4 * lane;
    if (qr >= a.cols || qc >= a.rows) continue;
    const uint32_t w = sm[cc * 32 + (lane ^ (cc >> 2))];
    uint8_t* out = t.q + qr * a.rows + qc;
    if (a.rows % 4 == 0) {
      *reinterpret_cast<uint32_t*>(out) = w;
    } else {
      for (int b = 0; b < 4 && qc + b < a.rows; ++b) out[b] = static_cast<uint8_t>(w >> (8 * b));
    }
  }
}

// In-place random Hadamard transform of the tile over its 128 rows (signs
// from the global row index): butterflies over the row bits a thread holds
// (rows within a group, groups) in registers, over the warp bits through
// shared memory (`hs`, 128 x 128 floats).
__device__ __forceinline__ void HadamardRows(Tile& v, float* hs, uint64_t seed, int64_t r0,
                                             int warp, int lane) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const float sg = minifloat::RandomSign(seed, TileRow(r0, warp, i, rr));
#pragma unroll
      for (int j = 0; j < 4; ++j) v[i][rr][j] *= sg;
    }
  }
  auto butterfly = [](float& p, float& q) {
    const float u = p, w = q;
    p = u + w;
    q = u - w;
  };
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      butterfly(v[i][0][j], v[i][1][j]);
      butterfly(v[i][2][j], v[i][3][j]);
      butterfly(v[i][0][j], v[i][2][j]);
      butterfly(v[i][1][j], v[i][3][j]);
    }
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      butterfly(v[0][rr][j], v[1][rr][j]);
      butterfly(v[2][rr][j], v[3][rr][j]);
      butterfly(v[0][rr][j], v[2][rr][j]);
      butterfly(v[1][rr][j], v[3][rr][j]);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int row = 4 * (warp + kWarps * i) + rr;
      *reinterpret_cast<float4*>(hs + row * kTile + lane * 4) =
          make_float4(v[i][rr][0], v[i][rr][1], v[i][rr][2], v[i][rr][3]);
    }
  }
  __syncthreads();
  // 8-point transforms across the warps: 2048 (group, row, column) lines.
  for (int line = threadIdx.x; line < 16 * kTile; line += kTileThreads) {
    const int col = line % kTile, i = line / kTile / 4, rr = line / kTile % 4;
    float u[kWarps];
#pragma unroll
    for (int w = 0; w < kWarps; ++w) u[w] = hs[(4 * (w + kWarps * i) + rr) * kTile + col];
#pragma unroll
    for (int h = 1; h < kWarps; h <<= 1) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        if ((w & h) == 0) butterfly(u[w], u[w + h]);
      }
    }
#pragma unroll
    for (int w = 0; w < kWarps; ++w) hs[(4 * (w + kWarps * i) + rr) * kTile + col] = u[w];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int rr = 0; rr < 4; ++rr) {
      const int row = 4 * (warp + kWarps * i) + rr;
      const float4 f = *reinterpret_cast<const float4*>(hs + row * kTile + lane * 4);
      v[i][rr][0] = f.x * kHadamardNorm128, v[i][rr][1] = f.y * kHadamardNorm128;
      v[i][rr][2] = f.z * kHadamardNorm128, v[i][rr][3] = f.w * kHadamardNorm128;
    }
  }
}

// (BR, BC): the block in q's orientation (1x128, 128x128 or 32x32). kDirect
// writes quantize(x) with x-blocks BR x BC, kT quantize(x^T) with x-blocks
// BC x BR, kHad transforms the data of the transposed output first. kSR
// compiles the stochastic-rounding encoder in: unrolled over 64 elements it
// is large, and round-to-nearest kernels that carried it ran at half speed
// (likely instruction-cache misses, judging by code size), so they are
// built without.
template <int BR, int BC, bool kDirect, bool kT, bool kHad, bool kSR>
__global__ void __launch_bounds__(kTileThreads, 2)
    QuantizeTileKernel(QuantizeArgs a, bool vec_ok) {
  extern __shared__ float4 dyn_smem[];
  __shared__ float red[kWarps][kTile];
  __shared__ uint32_t tsm[kT ? kTile * 32 : 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Column tiles vary fastest across consecutive blocks, so blocks running
  // together read whole rows (DRAM-page friendly) rather than a column slab.
  const int64_t col_tiles = (a.cols + kTile - 1) / kTile;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) / col_tiles * kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) % col_tiles * kTile;
  const int64_t c = c0 + lane * 4;
  Tile v;
  const bool whole = vec_ok && r0 + kTile <= a.rows && c0 + kTile <= a.cols;
  if (a.x_type == static_cast<int>(ElemType::kFloat32)) {
    LoadTile<float>(a, whole, r0, c, warp, v);
  } else {
    LoadTile<__nv_bfloat16>(a, whole, r0, c, warp, v);
  }
  const float fmax = a.format == 2 ? 57344.0f : 448.0f;
  constexpr bool kSquare = BR == BC;
  uint32_t word[4][4];

  if constexpr (kDirect) {
    TileScales<BR, BC> sc;
    sc.Compute(v, red, fmax, a.pow2, warp, lane);
    const QuantizeTarget& t = a.direct;
    if constexpr (BR == 1) {
      if (lane == 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int rr = 0; rr < 4; ++rr) {
            const int64_t r = TileRow(r0, warp, i, rr);
            if (r < a.rows) WriteScale(t, r, c0 / kTile, sc.s[i * 4 + rr]);
          }
        }
      }
    } else if constexpr (BR == 128) {
      if (threadIdx.x == 0) WriteScale(t, r0 / kTile, c0 / kTile, sc.s[0]);
    } else {
      if (warp == 0 && lane % 8 == 0 && c < a.cols) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (r0 + 32 * i < a.rows) WriteScale(t, r0 / 32 + i, c / 32, sc.s[i]);
        }
      }
    }
    Encode<BR, BC, false, kSR>(a, t, v, sc, r0, c, warp, word);
    StoreDirect(a, t, word, r0, c, warp);
    if constexpr (kT && kSquare && !kHad) {
      // Square blocks are transpose-invariant: same scales, and with
      // round-to-nearest the same bytes.
      const QuantizeTarget& tt = a.transposed;
      if (BR == 128 && threadIdx.x == 0) WriteScale(tt, c0 / kTile, r0 / kTile, sc.s[0]);
      if (BR == 32 && warp == 0 && lane % 8 == 0 && c < a.cols) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (r0 + 32 * i < a.rows) WriteScale(tt, c / 32, r0 / 32 + i, sc.s[i]);
        }
      }
      if (kSR && tt.stochastic) Encode<BR, BC, true, kSR>(a, tt, v, sc, r0, c, warp, word);
      StoreTransposed(a, tt, word, tsm, r0, c0, warp, lane);
      return;
    }
  }
  if constexpr (kT && !(kDirect && kSquare && !kHad)) {
    const QuantizeTarget& t = a.transposed;
    if constexpr (kHad) {
      HadamardRows(v, reinterpret_cast<float*>(dyn_smem), a.hadamard_seed, r0, warp, lane);
    }
    TileScales<BC, BR> sc;
    sc.Compute(v, red, fmax, a.pow2, warp, lane);
    if constexpr (BR == 1) {
      if (warp == 0) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (c + j < a.cols) WriteScale(t, c + j, r0 / kTile, sc.s[j]);
        }
      }
    } else if constexpr (BR == 128) {
      if (threadIdx.x == 0) WriteScale(t, c0 / kTile, r0 / kTile, sc.s[0]);
    } else {
      if (warp == 0 && lane % 8 == 0 && c < a.cols) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (r0 + 32 * i < a.rows) WriteScale(t, c / 32, r0 / 32 + i, sc.s[i]);
        }
      }
    }
    Encode<BC, BR, true, kSR>(a, t, v, sc, r0, c, warp, word);
    StoreTransposed(a, t, word, tsm, r0, c0, warp, lane);
  }
}

template <int BR, int BC, bool kDirect, bool kT, bool kHad, bool kSR>
cudaError_t LaunchTiles(const QuantizeArgs& a, cudaStream_t s) {
  const bool vec_ok = a.cols % 4 == 0 &&
                      reinterpret_cast<uintptr_t>(a.x) % (a.x_type == 0 ? 16 : 8) == 0;
  const int64_t blocks = static_cast<int64_t>(cuda_util::GridFor(a.rows, kTile)) *
                         cuda_util::GridFor(a.cols, kTile);
  if (blocks > INT32_MAX) return cudaErrorInvalidConfiguration;
  const size_t dyn = kHad ? kTile * kTile * sizeof(float) : 0;
  if (kHad) {
    const cudaError_t e = cudaFuncSetAttribute(QuantizeTileKernel<BR, BC, kDirect, kT, kHad, kSR>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(dyn));
    if (e != cudaSuccess) return e;
  }
  QuantizeTileKernel<BR, BC, kDirect, kT, kHad, kSR>
      <<<static_cast<unsigned>(blocks), kTileThreads, dyn, s>>>(a, vec_ok);
  return cudaGetLastError();
}

template <int BR, int BC, bool kDirect, bool kT, bool kHad>
cudaError_t Launch(const QuantizeArgs& a, cudaStream_t s) {
  const bool sr = (kDirect && a.direct.stochastic) || (kT && a.transposed.stochastic);
  return sr ? LaunchTiles<BR, BC, kDirect, kT, kHad, true>(a, s)
            : LaunchTiles<BR, BC, kDirect, kT, kHad, false>(a, s);
}

__global__ void DequantizeKernel(const uint8_t* __restrict__ q, int format,
                                 const float* __restrict__ scales, int64_t rows, int64_t cols,
                                 int br, int bc, void* x, int x_type) {
  const minifloat::Spec spec = format == 2 ? minifloat::E5M2() : minifloat::E4M3();
  const int64_t scale_cols = (cols + bc - 1) / bc;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float s = scales[(r / br) * scale_cols + c / bc];
    StoreF(x, ElemType(x_type), i, minifloat::Decode(spec, q[i]) * s);
  }
}

// Random Hadamard transform of chunks of up to 4096 elements in shared
// memory; chunks are whole segments, and the butterflies of stage h < block
// never cross a segment, so one chunk transforms all its segments at once.
constexpr int kChunk = 4096;

__global__ void __launch_bounds__(kThreads)
    HadamardKernel(const void* x, void* y, int type, int64_t numel, int64_t cols, int64_t block,
                   uint64_t seed, bool inverse) {
  __shared__ float s[kChunk];
  const int64_t start = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int n = static_cast<int>(numel - start < kChunk ? numel - start : kChunk);
  const float norm = rsqrtf(static_cast<float>(block));
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float v = LoadF(x, ElemType(type), start + i);
    s[i] = inverse ? v : v * minifloat::RandomSign(seed, (start + i) % cols);
  }
  __syncthreads();
  for (int h = 1; h < block; h <<= 1) {
    for (int p = threadIdx.x; p < n / 2; p += kThreads) {
      const int i = (p / h) * 2 * h + p % h;
      const float u = s[i], w = s[i + h];
      s[i] = u + w;
      s[i + h] = u - w;
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float v = s[i] * norm;
    StoreF(y, ElemType(type), start + i,
           inverse ? v * minifloat::RandomSign(seed, (start + i) % cols) : v);
  }
}

__global__ void ToE8M0Kernel(const float* __restrict__ in, uint8_t* __restrict__ out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = ToE8M0(in[i]);
}

__global__ void FromE8M0Kernel(const uint8_t* __restrict__ in, float* __restrict__ out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = ldexpf(1.0f, static_cast<int>(in[i]) - 127);
}

}  // namespace

cudaError_t Quantize(const QuantizeArgs& a, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (a.rows == 0 || a.cols == 0) return cudaSuccess;
  const bool d = a.direct.q != nullptr, t = a.transposed.q != nullptr;
  if (!d && !t) return cudaErrorInvalidValue;
  const int br = a.block_rows, bc = a.block_cols;
  if (br == 1 && bc == 128) {
    if (a.hadamard_transposed) {
      if (!t) return cudaErrorInvalidValue;
      return d ? Launch<1, 128, true, true, true>(a, s) : Launch<1, 128, false, true, true>(a, s);
    }
    if (d && t) return Launch<1, 128, true, true, false>(a, s);
    return d ? Launch<1, 128, true, false, false>(a, s) : Launch<1, 128, false, true, false>(a, s);
  }
  if (a.hadamard_transposed) return cudaErrorInvalidValue;
  if (br == 128 && bc == 128) {
    if (d && t) return Launch<128, 128, true, true, false>(a, s);
    return d ? Launch<128, 128, true, false, false>(a, s) : Launch<128, 128, false, true, false>(a, s);
  }
  if (br == 32 && bc == 32) {
    if (d && t) return Launch<32, 32, true, true, false>(a, s);
    return d ? Launch<32, 32, true, false, false>(a, s) : Launch<32, 32, false, true, false>(a, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t Dequantize(const uint8_t* q, int format, const float* scales, int64_t rows,
                       int64_t cols, int block_rows, int block_cols, void* x, int x_type,
                       void* stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(cuda_util::GridFor(n, 256), 65536));
  DequantizeKernel<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      q, format, scales, rows, cols, block_rows, block_cols, x, x_type);
  return cudaGetLastError();
}

cudaError_t Hadamard(const void* x, void* y, int type, int64_t numel, int64_t cols, int64_t block,
                     uint64_t seed, bool inverse, void* stream) {
  if (numel == 0) return cudaSuccess;
  HadamardKernel<<<cuda_util::GridFor(numel, kChunk), kThreads, 0,
                   static_cast<cudaStream_t>(stream)>>>(x, y, type, numel, cols, block, seed,
                                                        inverse);
  return cudaGetLastError();
}

cudaError_t ScalesToE8M0(const float* scales, uint8_t* out, int64_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  ToE8M0Kernel<<<cuda_util::GridFor(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      scales, out, n);
  return cudaGetLastError();
}

cudaError_t E8M0ToScales(const uint8_t* in, float* scales, int64_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  FromE8M0Kernel<<<cuda_util::GridFor(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      in, scales, n);
  return cudaGetLastError();
}

}  // namespace recfleet::quant_cuda
