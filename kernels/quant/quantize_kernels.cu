#include "kernels/quant/quantize_kernels.h"

#include <algorithm>

#include "kernels/quant/cuda_util.h"
#include "kernels/quant/minifloat.h"

namespace recfleet::quant_cuda {
namespace {

using cuda_util::ElemType;
using cuda_util::LoadF;
using cuda_util::StoreF;

constexpr int kThreads = 256;  // Hadamard and elementwise kernels
constexpr int kTileCols = 128;  // 32 lanes x 4 consecutive columns

// Quantize tiles: TR rows x 128 columns, WARPS warps, RPT rows per thread.
// The 128-row tiles use 16 warps (8 rows per thread) so the tile fits in
// registers without limiting occupancy.
template <int XR>
struct TileShape {
  static constexpr int kRows = XR == 1 ? 32 : XR;
  static constexpr int kWarps = XR == 128 ? 16 : 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRowsPerThread = kRows / kWarps;
};

__device__ __forceinline__ uint8_t ToE8M0(float pow2) {
  int e;
  frexpf(pow2, &e);  // 2^p = 0.5 * 2^(p + 1)
  return static_cast<uint8_t>(e - 1 + 127);
}

// Loads 4 consecutive elements of row r starting at column c (zeros past
// the edge).
__device__ __forceinline__ void Load4(const QuantizeArgs& a, bool vec_ok, int64_t r, int64_t c,
                                      float (&v)[4]) {
  const int64_t base = r * a.cols + c;
  if (vec_ok && c + 3 < a.cols) {
    if (a.x_type == static_cast<int>(ElemType::kFloat32)) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(a.x) + base));
      v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else {
      const uint2 raw =
          __ldg(reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(a.x) + base));
      const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = __bfloat162float(e[j]);
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[j] = c + j < a.cols ? LoadF(a.x, ElemType(a.x_type), base + j) : 0.0f;
  }
}

// One tile of TR rows x 128 columns of x per block. Thread (warp w, lane l)
// holds rows w + 8i and columns 4l..4l+3. (XR, XC) is the scale block in
// x's orientation; the amax reduction follows its shape.
template <int XR, int XC, bool kT>
__global__ void __launch_bounds__(TileShape<XR>::kThreads)
    QuantizeKernel(QuantizeArgs a, bool vec_ok) {
  constexpr int TR = TileShape<XR>::kRows;
  constexpr int kWarps = TileShape<XR>::kWarps;
  constexpr int RPT = TileShape<XR>::kRowsPerThread;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Column tiles vary fastest across consecutive blocks, so blocks running
  // together read whole rows (DRAM-page friendly) rather than a column slab.
  const int64_t col_tiles = (a.cols + kTileCols - 1) / kTileCols;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) / col_tiles * TR;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) % col_tiles * kTileCols;
  const int64_t cl = c0 + lane * 4;  // this thread's first column
  float v[RPT][4];
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
    const int64_t r = r0 + warp + kWarps * i;
    if (r < a.rows) {
      Load4(a, vec_ok, r, cl, v[i]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[i][j] = 0.0f;
    }
  }
  const minifloat::Spec spec = a.format == 2 ? minifloat::E5M2() : minifloat::E4M3();
  const float fmax = a.format == 2 ? 57344.0f : 448.0f;

  // scale[i][j]: the scale of element (i, j) of this thread.
  float scale[XR == 1 ? RPT : 1][XC == 1 ? 4 : 1];
  __shared__ float red[kWarps][kTileCols];
  if constexpr (XR == 1) {
    // One block per row (1 x 128): a warp reduction per row.
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
      float m = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) m = fmaxf(m, fabsf(v[i][j]));
      scale[i][0] = minifloat::BlockScale(cuda_util::WarpMax(m), fmax, a.pow2);
    }
  } else if constexpr (XC == 1) {
    // One block per column over TR rows: per-thread, then across warps.
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float m = 0.0f;
#pragma unroll
      for (int i = 0; i < RPT; ++i) m = fmaxf(m, fabsf(v[i][j]));
      red[warp][lane * 4 + j] = m;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float m = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) m = fmaxf(m, red[w][lane * 4 + j]);
      scale[0][j] = minifloat::BlockScale(m, fmax, a.pow2);
    }
  } else {
    // Square blocks (XR = TR rows, XC columns = XC / 4 lanes).
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) m = fmaxf(m, fabsf(v[i][j]));
    }
#pragma unroll
    for (int o = 1; o < XC / 4; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    red[warp][lane] = m;
    __syncthreads();
    float t = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) t = fmaxf(t, red[w][lane]);
    scale[0][0] = minifloat::BlockScale(t, fmax, a.pow2);
  }

  // Scale outputs, one writer per block, in q's orientation.
  auto write_scale = [&](int64_t xr, int64_t xc, float s) {
    const int64_t bi = kT ? xc / XC : xr / XR, bj = kT ? xr / XR : xc / XC;
    const int64_t idx = bi * a.scale_stride_row + bj * a.scale_stride_col;
    if (a.e8m0 != nullptr) {
      a.e8m0[idx] = ToE8M0(s);
    } else {
      a.scales[idx] = s;
    }
  };
  if constexpr (XR == 1) {
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < RPT; ++i) {
        const int64_t r = r0 + warp + kWarps * i;
        if (r < a.rows) write_scale(r, c0, scale[i][0]);
      }
    }
  } else if constexpr (XC == 1) {
    if (warp == 0) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (cl + j < a.cols) write_scale(r0, cl + j, scale[0][j]);
      }
    }
  } else {
    if (warp == 0 && lane % (XC / 4) == 0 && cl < a.cols) write_scale(r0, cl, scale[0][0]);
  }

  // Encode.
  uint8_t q[RPT][4];
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
    const int64_t r = r0 + warp + kWarps * i;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float x = v[i][j] * minifloat::Reciprocal(scale[XR == 1 ? i : 0][XC == 1 ? j : 0]);
      if (a.stochastic) {
        const int64_t c = cl + j;
        const uint64_t k = kT ? static_cast<uint64_t>(c * a.rows + r)
                              : static_cast<uint64_t>(r * a.cols + c);
        q[i][j] = minifloat::EncodeStochastic(spec, x, minifloat::UniformFromCounter(a.seed, k));
      } else {
        q[i][j] = minifloat::Encode(spec, x);
      }
    }
  }

  if constexpr (!kT) {
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
      const int64_t r = r0 + warp + kWarps * i;
      if (r >= a.rows) continue;
      uint8_t* out = a.q + r * a.cols + cl;
      if (a.cols % 4 == 0 && cl + 3 < a.cols) {
        *reinterpret_cast<uint32_t*>(out) = q[i][0] | (q[i][1] << 8) | (q[i][2] << 16) |
                                            (static_cast<uint32_t>(q[i][3]) << 24);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (cl + j < a.cols) out[j] = q[i][j];
        }
      }
    }
  } else {
    // Transpose through shared memory: q row = x column, TR bytes each.
    // Odd pitch: the 32 lanes' byte writes land in 32 different banks.
    constexpr int kPitch = TR + 1;
    __shared__ uint8_t tile[kTileCols * kPitch];
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) tile[(lane * 4 + j) * kPitch + warp + kWarps * i] = q[i][j];
    }
    __syncthreads();
    constexpr int kWordsPerRow = TR / 4;
    for (int w = threadIdx.x; w < kTileCols * kWordsPerRow; w += TileShape<XR>::kThreads) {
      const int cc = w / kWordsPerRow, rr = (w % kWordsPerRow) * 4;
      const int64_t qr = c0 + cc, qc = r0 + rr;  // q coordinates
      if (qr >= a.cols || qc >= a.rows) continue;
      uint8_t* out = a.q + qr * a.rows + qc;
      const uint8_t* src = tile + cc * kPitch + rr;
      if (a.rows % 4 == 0) {
        *reinterpret_cast<uint32_t*>(out) = src[0] | (src[1] << 8) | (src[2] << 16) |
                                            (static_cast<uint32_t>(src[3]) << 24);
      } else {
        for (int j = 0; j < 4 && qc + j < a.rows; ++j) out[j] = src[j];
      }
    }
  }
}

template <int XR, int XC, bool kT>
cudaError_t Launch(const QuantizeArgs& a, cudaStream_t s) {
  constexpr int TR = TileShape<XR>::kRows;
  const bool vec_ok = a.cols % 4 == 0 &&
                      reinterpret_cast<uintptr_t>(a.x) % (a.x_type == 0 ? 16 : 8) == 0;
  const int64_t blocks = static_cast<int64_t>(cuda_util::GridFor(a.rows, TR)) *
                         cuda_util::GridFor(a.cols, kTileCols);
  if (blocks > INT32_MAX) return cudaErrorInvalidConfiguration;
  const unsigned grid = static_cast<unsigned>(blocks);
  QuantizeKernel<XR, XC, kT><<<grid, TileShape<XR>::kThreads, 0, s>>>(a, vec_ok);
  return cudaGetLastError();
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
  const int br = a.block_rows, bc = a.block_cols;
  if (br == 1 && bc == 128) return a.transpose ? Launch<128, 1, true>(a, s) : Launch<1, 128, false>(a, s);
  if (br == 128 && bc == 128) {
    return a.transpose ? Launch<128, 128, true>(a, s) : Launch<128, 128, false>(a, s);
  }
  if (br == 32 && bc == 32) return a.transpose ? Launch<32, 32, true>(a, s) : Launch<32, 32, false>(a, s);
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
