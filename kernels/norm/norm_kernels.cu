#include "kernels/norm/norm_kernels.h"

#include <algorithm>

#include "kernels/base/cuda_util.h"
#include "kernels/base/minifloat.h"

namespace recfleet::norm_cuda {
namespace {

using cuda_util::ElemType;
using cuda_util::LoadF;
using cuda_util::StoreF;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Row layout: 128-column segments, one warp per segment at a time, 4
// consecutive columns per lane, so a segment is exactly one 1x128 FP8 block.
constexpr int kSeg = 128;

__device__ float BlockSum(float v, float* smem) {
  v = cuda_util::WarpSum(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // smem may still be read from a previous reduction
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float t = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) t += smem[w];
  return t;
}

struct Params {
  Shape s;
  const void* x;
  ElemType xt;
  const void* gamma;
  ElemType gt;
  const void* beta;
  ElemType bt;
  float eps;
  void* y;
  ElemType yt;
  int fp8;  // 0 none, 1 E4M3, 2 E5M2
  float* y_scales;
  float* mean;
  float* rstd;
};

__global__ void __launch_bounds__(kThreads) ForwardKernel(Params p) {
  __shared__ float smem[kWarps];
  const int64_t row = blockIdx.x;
  const int64_t dim = p.s.dim, base = row * dim;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t segs = (dim + kSeg - 1) / kSeg;
  float mu = 0.0f;
  if (p.s.layer_norm) {
    float sum = 0;
    for (int64_t c = threadIdx.x; c < dim; c += kThreads) sum += LoadF(p.x, p.xt, base + c);
    mu = BlockSum(sum, smem) / static_cast<float>(dim);
  }
  float sq = 0;
  for (int64_t c = threadIdx.x; c < dim; c += kThreads) {
    const float v = LoadF(p.x, p.xt, base + c) - mu;
    sq += v * v;
  }
  const float rs = rsqrtf(BlockSum(sq, smem) / static_cast<float>(dim) + p.eps);
  if (threadIdx.x == 0) {
    p.rstd[row] = rs;
    if (p.s.layer_norm) p.mean[row] = mu;
  }
  const minifloat::Spec spec = p.fp8 == 2 ? minifloat::E5M2() : minifloat::E4M3();
  const float fmax = p.fp8 == 2 ? 57344.0f : 448.0f;
  for (int64_t seg = warp; seg < segs; seg += kWarps) {
    float v[4];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = seg * kSeg + lane * 4 + j;
      v[j] = 0.0f;
      if (c < dim) {
        v[j] = (LoadF(p.x, p.xt, base + c) - mu) * rs * LoadF(p.gamma, p.gt, c);
        if (p.s.layer_norm) v[j] += LoadF(p.beta, p.bt, c);
        amax = fmaxf(amax, fabsf(v[j]));
      }
    }
    if (p.fp8 == 0) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t c = seg * kSeg + lane * 4 + j;
        if (c < dim) StoreF(p.y, p.yt, base + c, v[j]);
      }
      continue;
    }
    const float scale = minifloat::BlockScale(cuda_util::WarpMax(amax), fmax, false);
    if (lane == 0) p.y_scales[row * segs + seg] = scale;
    const float inv = minifloat::Reciprocal(scale);
    uint8_t* y8 = static_cast<uint8_t*>(p.y);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = seg * kSeg + lane * 4 + j;
      if (c < dim) y8[base + c] = minifloat::Encode(spec, v[j] * inv);
    }
  }
}

// Rows of whole 128-column segments (dim % 128 == 0, up to 16 x 8
// segments), 16-byte aligned: a block of 256 threads per row, as 16
// half-warps of 16 lanes, 8 consecutive columns per lane, so a half-warp
// covers one segment (= one 1x128 FP8 block) per step. Half-warp h takes
// segments h, h + hw, ... (hw = min(16, segments)), S of them. The whole
// row stays in registers: every load is issued before the first use, the
// statistics come from one block reduction (two for LayerNorm), and x is
// read once, where ForwardKernel reads it two or three times with scalar
// loads. FP8 encoding as the quantize row kernel: packed cvt.rn.satfinite,
// one 8-byte store per lane.
constexpr int kRowMaxSlots = 8;

template <typename T>
__device__ __forceinline__ void LoadF8(const void* p, int64_t i, float (&out)[8]) {
  cuda_util::Widen8<T>(cuda_util::LoadRaw8<T>(static_cast<const T*>(p) + i, true), out);
}

// 8 consecutive parameters (gamma or beta) at element i, fp32 or bf16.
__device__ __forceinline__ void LoadParam8(const void* p, ElemType t, int64_t i, float (&out)[8]) {
  if (t == ElemType::kBFloat16) {
    LoadF8<__nv_bfloat16>(p, i, out);
  } else {
    LoadF8<float>(p, i, out);
  }
}

// kLayerNorm and kE5M2 are p.s.layer_norm and p.fp8 == 2 as compile-time
// choices: the kernel is bound by instructions at about 80% of the SMs'
// issue rate, and the run-time checks cost a subtraction of a zero mean and
// a second packed conversion per element pair.
template <typename XT, int S, bool kLayerNorm, bool kE5M2>
__global__ void __launch_bounds__(kThreads) ForwardRowsKernel(Params p) {
  __shared__ float smem[kWarps];
  const int64_t row = blockIdx.x;
  const int64_t dim = p.s.dim, base = row * dim;
  const int segs = static_cast<int>(dim / kSeg);
  const int hw = segs < 16 ? segs : 16;
  const int half = threadIdx.x >> 4, lane = threadIdx.x & 15;
  const XT* x = static_cast<const XT*>(p.x) + base;
  cuda_util::Raw8<XT> raw[S];
  bool valid[S];
#pragma unroll
  for (int k = 0; k < S; ++k) {
    const int seg = k * hw + half;
    valid[k] = half < hw && seg < segs;
    raw[k] = cuda_util::LoadRaw8<XT>(x + seg * kSeg + lane * 8, valid[k]);
  }
  // x stays as loaded (bf16: half the registers) and is widened where used.
  float mu = 0.0f;
  if constexpr (kLayerNorm) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < S; ++k) {
      float v[8];
      cuda_util::Widen8<XT>(raw[k], v);
#pragma unroll
      for (int j = 0; j < 8; ++j) sum += v[j];
    }
    mu = BlockSum(sum, smem) / static_cast<float>(dim);
  }
  float sq = 0.0f;
#pragma unroll
  for (int k = 0; k < S; ++k) {
    if (!valid[k]) continue;
    float v[8];
    cuda_util::Widen8<XT>(raw[k], v);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float c = kLayerNorm ? v[j] - mu : v[j];
      sq += c * c;
    }
  }
  const float rs = rsqrtf(BlockSum(sq, smem) / static_cast<float>(dim) + p.eps);
  if (threadIdx.x == 0) {
    p.rstd[row] = rs;
    if (kLayerNorm) p.mean[row] = mu;
  }
  constexpr bool e5m2 = kE5M2;
  const float fmax = e5m2 ? 57344.0f : 448.0f;
#pragma unroll
  for (int k = 0; k < S; ++k) {
    // Every lane takes part in the shuffles below; only valid segments load
    // parameters and store.
    const int seg = k * hw + half;
    const int64_t c = static_cast<int64_t>(seg) * kSeg + lane * 8;
    float y[8];
    if (valid[k]) {
      float v[8], g[8];
      cuda_util::Widen8<XT>(raw[k], v);
      LoadParam8(p.gamma, p.gt, c, g);
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = (kLayerNorm ? v[j] - mu : v[j]) * rs * g[j];
      if constexpr (kLayerNorm) {
        float b[8];
        LoadParam8(p.beta, p.bt, c, b);
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] += b[j];
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = 0.0f;
    }
    if (p.fp8 == 0) {
      if (!valid[k]) continue;
      if (p.yt == ElemType::kBFloat16) {
        cuda_util::StoreVec<__nv_bfloat16, 8>(static_cast<__nv_bfloat16*>(p.y) + base + c, y);
      } else {
        float* out = static_cast<float*>(p.y) + base + c;
        *reinterpret_cast<float4*>(out) = make_float4(y[0], y[1], y[2], y[3]);
        *reinterpret_cast<float4*>(out + 4) = make_float4(y[4], y[5], y[6], y[7]);
      }
      continue;
    }
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(y[j]));
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (!valid[k]) continue;
    const float scale = minifloat::BlockScale(m, fmax, false);
    if (lane == 0) p.y_scales[row * segs + seg] = scale;
    const float inv = __frcp_rn(scale);  // correctly rounded, as minifloat::Reciprocal
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] *= inv;
    *reinterpret_cast<uint2*>(static_cast<uint8_t*>(p.y) + base + c) =
        minifloat::EncodeNearest8(y, e5m2);
  }
}

// Slots per half-warp for ForwardRowsKernel, 0 when the row layout does
// not fit it (the general ForwardKernel then runs).
int RowSlots(const Params& p) {
  auto aligned = [](const void* q, int bytes) {
    return reinterpret_cast<uintptr_t>(q) % bytes == 0;
  };
  const int64_t dim = p.s.dim;
  if (dim == 0 || dim % kSeg != 0 || dim > kSeg * 16 * kRowMaxSlots) return 0;
  if (!aligned(p.x, 16) || !aligned(p.gamma, 16)) return 0;
  if (p.s.layer_norm && !aligned(p.beta, 16)) return 0;
  if (!aligned(p.y, p.fp8 != 0 ? 8 : 16)) return 0;
  const int segs = static_cast<int>(dim / kSeg);
  const int hw = segs < 16 ? segs : 16;
  const int need = (segs + hw - 1) / hw;
  int slots = 1;
  while (slots < need) slots <<= 1;
  return slots;
}

template <int S, typename XT, bool kLayerNorm>
cudaError_t LaunchRowsAs(const Params& p, cudaStream_t st) {
  const unsigned grid = static_cast<unsigned>(p.s.rows);
  if (p.fp8 == 2) {
    ForwardRowsKernel<XT, S, kLayerNorm, true><<<grid, kThreads, 0, st>>>(p);
  } else {
    ForwardRowsKernel<XT, S, kLayerNorm, false><<<grid, kThreads, 0, st>>>(p);
  }
  return cudaGetLastError();
}

template <int S>
cudaError_t LaunchRows(const Params& p, cudaStream_t st) {
  const bool bf16 = p.xt == ElemType::kBFloat16;
  if (p.s.layer_norm) {
    return bf16 ? LaunchRowsAs<S, __nv_bfloat16, true>(p, st)
                : LaunchRowsAs<S, float, true>(p, st);
  }
  return bf16 ? LaunchRowsAs<S, __nv_bfloat16, false>(p, st)
              : LaunchRowsAs<S, float, false>(p, st);
}

struct BackParams {
  Shape s;
  const void* dy;
  ElemType dyt;
  const void* x;
  ElemType xt;
  const void* gamma;
  ElemType gt;
  const float* mean;
  const float* rstd;
  void* dx;
  ElemType dxt;
};

__global__ void __launch_bounds__(kThreads) BackwardKernel(BackParams p) {
  __shared__ float smem[kWarps];
  const int64_t row = blockIdx.x;
  const int64_t dim = p.s.dim, base = row * dim;
  const float mu = p.s.layer_norm ? p.mean[row] : 0.0f;
  const float rs = p.rstd[row];
  float sg = 0, sgx = 0;
  for (int64_t c = threadIdx.x; c < dim; c += kThreads) {
    const float g = LoadF(p.dy, p.dyt, base + c) * LoadF(p.gamma, p.gt, c);
    const float xhat = (LoadF(p.x, p.xt, base + c) - mu) * rs;
    sg += g;
    sgx += g * xhat;
  }
  const float mean_g = p.s.layer_norm ? BlockSum(sg, smem) / static_cast<float>(dim) : 0.0f;
  const float mean_gx = BlockSum(sgx, smem) / static_cast<float>(dim);
  for (int64_t c = threadIdx.x; c < dim; c += kThreads) {
    const float g = LoadF(p.dy, p.dyt, base + c) * LoadF(p.gamma, p.gt, c);
    const float xhat = (LoadF(p.x, p.xt, base + c) - mu) * rs;
    StoreF(p.dx, p.dxt, base + c, rs * (g - mean_g - xhat * mean_gx));
  }
}

// Column partial sums of dy * xhat (and dy) over a chunk of rows:
// partial[chunk][col]. Threads walk adjacent columns, so loads coalesce.
__global__ void __launch_bounds__(kThreads)
    ParamGradPartialKernel(BackParams p, int64_t rows_per_chunk, float* __restrict__ part_g,
                           float* __restrict__ part_b) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (col >= p.s.dim) return;
  const int64_t r0 = blockIdx.y * rows_per_chunk;
  const int64_t r1 = min(p.s.rows, r0 + rows_per_chunk);
  float g = 0, b = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const float dy = LoadF(p.dy, p.dyt, r * p.s.dim + col);
    const float mu = p.s.layer_norm ? p.mean[r] : 0.0f;
    g += dy * (LoadF(p.x, p.xt, r * p.s.dim + col) - mu) * p.rstd[r];
    b += dy;
  }
  part_g[blockIdx.y * p.s.dim + col] = g;
  if (part_b != nullptr) part_b[blockIdx.y * p.s.dim + col] = b;
}

// Rows of width 32 * kVec (at most 1,024): the dx rows and the column
// partial sums of dgamma (and dbeta) in one pass over dy and x. Block b
// takes rows [b * rows_per_block, ...), one warp per row at a time, lane l
// holding columns l + 32 j; each lane keeps its columns' sums in registers
// over its rows, then the block adds its warps' sums in warp order into
// part[b][col]. Every sum has a fixed order: the same bits every run.
template <int kVec>
__global__ void __launch_bounds__(kThreads)
    BackwardRowsKernel(BackParams p, int64_t rows_per_block, float* __restrict__ part_g,
                       float* __restrict__ part_b) {
  constexpr int kDim = 32 * kVec;
  __shared__ float red[kWarps][kDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r0 = blockIdx.x * rows_per_block;
  const int64_t r1 = min(p.s.rows, r0 + rows_per_block);
  const bool ln = p.s.layer_norm, with_b = part_b != nullptr;
  float gam[kVec], acc_g[kVec], acc_b[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    gam[j] = LoadF(p.gamma, p.gt, lane + 32 * j);
    acc_g[j] = 0.0f;
    acc_b[j] = 0.0f;
  }
  for (int64_t r = r0 + warp; r < r1; r += kWarps) {
    const int64_t base = r * kDim;
    const float mu = ln ? p.mean[r] : 0.0f;
    const float rs = p.rstd[r];
    float g[kVec], xhat[kVec], sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float dy = LoadF(p.dy, p.dyt, base + lane + 32 * j);
      xhat[j] = (LoadF(p.x, p.xt, base + lane + 32 * j) - mu) * rs;
      g[j] = dy * gam[j];
      sg += g[j];
      sgx += g[j] * xhat[j];
      acc_g[j] += dy * xhat[j];
      acc_b[j] += dy;
    }
    const float mean_g = ln ? cuda_util::WarpSum(sg) / static_cast<float>(kDim) : 0.0f;
    const float mean_gx = cuda_util::WarpSum(sgx) / static_cast<float>(kDim);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      StoreF(p.dx, p.dxt, base + lane + 32 * j, rs * (g[j] - mean_g - xhat[j] * mean_gx));
    }
  }
  for (int pass = 0; pass < (with_b ? 2 : 1); ++pass) {
    float* part = pass == 0 ? part_g : part_b;
#pragma unroll
    for (int j = 0; j < kVec; ++j) red[warp][lane + 32 * j] = pass == 0 ? acc_g[j] : acc_b[j];
    __syncthreads();
    for (int c = threadIdx.x; c < kDim; c += kThreads) {
      float t = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) t += red[w][c];
      part[blockIdx.x * kDim + c] = t;
    }
    __syncthreads();
  }
}

template <int kVec>
cudaError_t LaunchBackwardRows(const BackParams& p, int64_t chunks, int64_t rows_per_chunk,
                               float* part, float* part_b, cudaStream_t st) {
  BackwardRowsKernel<kVec><<<static_cast<unsigned>(chunks), kThreads, 0, st>>>(p, rows_per_chunk,
                                                                              part, part_b);
  return cudaGetLastError();
}

// The row kernel's lanes per row: dim / 32 for the widths it takes, else 0.
int RowVec(const Shape& s) {
  if (s.dim % 32 != 0) return 0;
  const int64_t v = s.dim / 32;
  return v == 1 || v == 2 || v == 4 || v == 8 || v == 16 || v == 32 ? static_cast<int>(v) : 0;
}

__global__ void SumChunksKernel(const float* __restrict__ part, int64_t chunks, int64_t dim,
                                float* __restrict__ out) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= dim) return;
  float s = 0;
  for (int64_t k = 0; k < chunks; ++k) s += part[k * dim + col];
  out[col] = s;
}

}  // namespace

cudaError_t Forward(const Shape& s, const void* x, int x_type, const void* gamma, int gamma_type,
                    const void* beta, int beta_type, float eps, void* y, int y_type,
                    int y_fp8_format, float* y_scales, float* mean, float* rstd, void* stream) {
  if (s.rows == 0) return cudaSuccess;
  Params p{s,   x,   ElemType(x_type), gamma, ElemType(gamma_type), beta, ElemType(beta_type),
           eps, y,   ElemType(y_type), y_fp8_format, y_scales, mean, rstd};
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  switch (RowSlots(p)) {
    case 1: return LaunchRows<1>(p, st);
    case 2: return LaunchRows<2>(p, st);
    case 4: return LaunchRows<4>(p, st);
    case 8: return LaunchRows<8>(p, st);
    default:
      ForwardKernel<<<static_cast<unsigned>(s.rows), kThreads, 0, st>>>(p);
      return cudaGetLastError();
  }
}

cudaError_t Backward(const Shape& s, const void* dy, int dy_type, const void* x, int x_type,
                     const void* gamma, int gamma_type, const float* mean, const float* rstd,
                     void* dx, int dx_type, float* dgamma, float* dbeta, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  BackParams p{s, dy, ElemType(dy_type), x, ElemType(x_type), gamma, ElemType(gamma_type),
               mean, rstd, dx, ElemType(dx_type)};
  // Widths the row kernel takes: dx and the column partials in one pass.
  const int vec = s.rows > 0 ? RowVec(s) : 0;
  if (vec == 0 && s.rows > 0) {
    BackwardKernel<<<static_cast<unsigned>(s.rows), kThreads, 0, st>>>(p);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  // Deterministic two-stage column reduction for dgamma/dbeta: partial sums
  // over chunks of consecutive rows (the row kernel's blocks: a warp's
  // worth of rows at least), then the chunks added in order.
  const int64_t chunk_rows = vec > 0 ? (s.rows + kWarps - 1) / kWarps : s.rows;
  const int64_t chunks = s.rows == 0 ? 1 : std::min<int64_t>(chunk_rows, 256);
  const int64_t rows_per_chunk = s.rows == 0 ? 1 : (s.rows + chunks - 1) / chunks;
  float* part = nullptr;
  const size_t n = static_cast<size_t>(chunks * s.dim);
  cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&part), 2 * n * sizeof(float), st);
  if (err != cudaSuccess) return err;
  float* part_b = dbeta != nullptr ? part + n : nullptr;
  switch (vec) {
    case 0: {
      dim3 grid(cuda_util::GridFor(s.dim, kThreads), static_cast<unsigned>(chunks));
      ParamGradPartialKernel<<<grid, kThreads, 0, st>>>(p, rows_per_chunk, part, part_b);
      err = cudaGetLastError();
      break;
    }
    case 1: err = LaunchBackwardRows<1>(p, chunks, rows_per_chunk, part, part_b, st); break;
    case 2: err = LaunchBackwardRows<2>(p, chunks, rows_per_chunk, part, part_b, st); break;
    case 4: err = LaunchBackwardRows<4>(p, chunks, rows_per_chunk, part, part_b, st); break;
    case 8: err = LaunchBackwardRows<8>(p, chunks, rows_per_chunk, part, part_b, st); break;
    case 16: err = LaunchBackwardRows<16>(p, chunks, rows_per_chunk, part, part_b, st); break;
    default: err = LaunchBackwardRows<32>(p, chunks, rows_per_chunk, part, part_b, st); break;
  }
  if (err == cudaSuccess) {
    const unsigned g1 = cuda_util::GridFor(s.dim, kThreads);
    SumChunksKernel<<<g1, kThreads, 0, st>>>(part, chunks, s.dim, dgamma);
    if (dbeta != nullptr) SumChunksKernel<<<g1, kThreads, 0, st>>>(part_b, chunks, s.dim, dbeta);
    err = cudaGetLastError();
  }
  const cudaError_t free_err = cudaFreeAsync(part, st);
  return err != cudaSuccess ? err : free_err;
}

}  // namespace recfleet::norm_cuda
