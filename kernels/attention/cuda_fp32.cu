// fp32 jagged attention on CUDA: see cuda_fp32.h. Written for exactness,
// not speed: the tensor-core kernels (bf16) are the fast path.

#include <cfloat>

#include "kernels/attention/cuda_fp32.h"

namespace recfleet::attention::fp32_cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxDim = 256;

cudaStream_t S(void* s) { return static_cast<cudaStream_t>(s); }

// The sequence b with offsets[b] <= row < offsets[b + 1].
__device__ __forceinline__ int SequenceOf(const int64_t* offsets, int batch, int64_t row) {
  int lo = 0, hi = batch;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (offsets[mid] <= row) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  // Skip empty sequences that share the start.
  while (lo + 1 < batch && offsets[lo + 1] <= row) ++lo;
  return lo;
}

// Visible key range [*begin, *end) of query i (as internal::VisibleKeys).
__device__ __forceinline__ void KeyRange(const Params& p, int64_t lq, int64_t lk, int64_t i,
                                         int64_t* begin, int64_t* end) {
  const int64_t pq = i + (lk - lq);
  int64_t b = 0, e = lk;
  if (p.mask == 1) {
    e = min(lk, pq + 1);
  } else if (p.mask == 2) {
    b = max(int64_t{0}, pq - p.window + 1);
    e = min(lk, pq + 1);
  } else if (p.mask == 3) {
    const int64_t blk = pq >= 0 ? pq / p.block : -((-pq + p.block - 1) / p.block);
    b = max(int64_t{0}, blk * p.block);
    e = min(lk, (blk + 1) * p.block);
  }
  if (e < b) e = b;
  *begin = b;
  *end = e;
}

__device__ __forceinline__ float Sigmoid(float x) {
  return x >= 0 ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
}

__device__ __forceinline__ float Act(int a, float s) {
  return a == 1 ? 0.5f * s * (1.0f + erff(s * 0.70710678118654752f)) : s * Sigmoid(s);
}

__device__ __forceinline__ float ActGrad(int a, float s) {
  if (a == 1) {
    return 0.5f * (1.0f + erff(s * 0.70710678118654752f)) +
           s * 0.39894228040143267794f * expf(-0.5f * s * s);
  }
  const float g = Sigmoid(s);
  return g * (1.0f + s * (1.0f - g));
}

__device__ __forceinline__ float Dot(const float* a, const float* b, int d) {
  float s = 0;
  for (int c = 0; c < d; ++c) s += a[c] * b[c];
  return s;
}

// Block-wide sum and max of one value per thread.
__device__ float BlockSum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float t = 0;
  for (int w = 0; w < kThreads / 32; ++w) t += scratch[w];
  return t;
}

__device__ float BlockMax(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float t = -FLT_MAX;
  for (int w = 0; w < kThreads / 32; ++w) t = fmaxf(t, scratch[w]);
  return t;
}

struct Row {
  int64_t q_row, k_begin, k_end;  // k rows are absolute
  bool valid;
};

__device__ Row RowOf(const Params& p, int64_t q_row) {
  const int b = SequenceOf(p.q_offsets, p.batch, q_row);
  const int64_t lq = p.q_offsets[b + 1] - p.q_offsets[b];
  const int64_t lk = p.k_offsets[b + 1] - p.k_offsets[b];
  int64_t kb, ke;
  KeyRange(p, lq, lk, q_row - p.q_offsets[b], &kb, &ke);
  Row r;
  r.q_row = q_row;
  r.k_begin = p.k_offsets[b] + kb;
  r.k_end = p.k_offsets[b] + ke;
  r.valid = ke > kb;
  return r;
}

__global__ void __launch_bounds__(kThreads) ForwardKernel(Params p, const float* q,
                                                          const float* k, const float* v,
                                                          float* out, float* lse) {
  __shared__ float qs[kMaxDim], acc[kMaxDim], ps[kThreads], scratch[kThreads / 32];
  const int h = blockIdx.y, d = p.head_dim, H = p.heads;
  const Row r = RowOf(p, blockIdx.x);
  const int64_t stride = int64_t{H} * d;
  for (int c = threadIdx.x; c < d; c += kThreads) {
    qs[c] = q[r.q_row * stride + h * d + c];
    acc[c] = 0;
  }
  __syncthreads();
  float m = -FLT_MAX, l = 0;
  if (p.activation == 0) {
    // Pass 1: the row's max and normalizer.
    for (int64_t j = r.k_begin + threadIdx.x; j < r.k_end; j += kThreads) {
      const float s = p.scale * Dot(qs, k + j * stride + h * d, d);
      if (s > m) {
        l = l * expf(m - s) + 1.0f;
        m = s;
      } else {
        l += expf(s - m);
      }
    }
    const float gm = BlockMax(m, scratch);
    const float gl = BlockSum(l == 0 ? 0.0f : l * expf(m - gm), scratch);
    m = gm;
    l = gl;
  }
  // Pass 2: out = sum_j p_ij v_j, a tile of keys at a time.
  for (int64_t t0 = r.k_begin; t0 < r.k_end; t0 += kThreads) {
    const int64_t j = t0 + threadIdx.x;
    float pj = 0;
    if (j < r.k_end) {
      const float s = p.scale * Dot(qs, k + j * stride + h * d, d);
      pj = p.activation == 0 ? expf(s - m) / l : Act(p.activation, s);
    }
    __syncthreads();
    ps[threadIdx.x] = pj;
    __syncthreads();
    const int n = static_cast<int>(r.k_end - t0 < kThreads ? r.k_end - t0 : kThreads);
    for (int c = threadIdx.x; c < d; c += kThreads) {
      float a = acc[c];
      for (int t = 0; t < n; ++t) a += ps[t] * v[(t0 + t) * stride + h * d + c];
      acc[c] = a;
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < d; c += kThreads) out[r.q_row * stride + h * d + c] = acc[c];
  if (lse != nullptr && threadIdx.x == 0) {
    lse[r.q_row * H + h] = r.valid ? m + logf(l) : -INFINITY;
  }
}

__global__ void __launch_bounds__(kThreads) BackwardKernel(Params p, const float* q,
                                                           const float* k, const float* v,
                                                           const float* out, const float* lse,
                                                           const float* d_out, float* dq,
                                                           float* dk, float* dv) {
  __shared__ float qs[kMaxDim], dos[kMaxDim], dqs[kMaxDim], ds_s[kThreads], scratch[kThreads / 32];
  const int h = blockIdx.y, d = p.head_dim, H = p.heads;
  const Row r = RowOf(p, blockIdx.x);
  const int64_t stride = int64_t{H} * d, base = r.q_row * stride + h * d;
  float part = 0;
  for (int c = threadIdx.x; c < d; c += kThreads) {
    qs[c] = q[base + c];
    dos[c] = d_out[base + c];
    dqs[c] = 0;
    part += d_out[base + c] * out[base + c];
  }
  const float delta = BlockSum(part, scratch);  // includes a __syncthreads
  const float row_lse = p.activation == 0 ? lse[r.q_row * H + h] : 0.0f;
  for (int64_t t0 = r.k_begin; t0 < r.k_end; t0 += kThreads) {
    const int64_t j = t0 + threadIdx.x;
    float ds = 0;
    if (j < r.k_end) {
      const float* kj = k + j * stride + h * d;
      const float* vj = v + j * stride + h * d;
      const float s = p.scale * Dot(qs, kj, d);
      const float dp = Dot(dos, vj, d);
      float pj;
      if (p.activation == 0) {
        pj = expf(s - row_lse);
        ds = pj * (dp - delta);
      } else {
        pj = Act(p.activation, s);
        ds = ActGrad(p.activation, s) * dp;
      }
      float* dvj = dv + j * stride + h * d;
      float* dkj = dk + j * stride + h * d;
      for (int c = 0; c < d; ++c) {
        atomicAdd(dvj + c, pj * dos[c]);
        atomicAdd(dkj + c, p.scale * ds * qs[c]);
      }
    }
    __syncthreads();
    ds_s[threadIdx.x] = ds;
    __syncthreads();
    const int n = static_cast<int>(r.k_end - t0 < kThreads ? r.k_end - t0 : kThreads);
    for (int c = threadIdx.x; c < d; c += kThreads) {
      float a = dqs[c];
      for (int t = 0; t < n; ++t) a += ds_s[t] * k[(t0 + t) * stride + h * d + c];
      dqs[c] = a;
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < d; c += kThreads) dq[base + c] = p.scale * dqs[c];
}

// Position of a row for RoPE.
__device__ int64_t PositionOf(const Params& p, bool is_query, int64_t row) {
  const int64_t* own = is_query ? p.q_offsets : p.k_offsets;
  const int b = SequenceOf(own, p.batch, row);
  const int64_t i = row - own[b];
  if (!is_query) return i;
  return i + (p.k_offsets[b + 1] - p.k_offsets[b]) - (p.q_offsets[b + 1] - p.q_offsets[b]);
}

__device__ __forceinline__ void RopeAngle(const TransformArgs& t, int64_t pos, int c, int d,
                                          float* cs, float* sn) {
  // angle = pos * theta^(-2c/d), computed in double for large positions.
  const double inv = exp2(-static_cast<double>(t.log2_theta) * 2.0 * c / d);
  const double a = static_cast<double>(pos) * inv;
  *cs = static_cast<float>(cos(a));
  *sn = static_cast<float>(sin(a));
}

// One thread per (row, head).
__global__ void TransformKernel(Params p, TransformArgs t, bool is_query, int64_t rows,
                                const float* x, float* y) {
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= rows * p.heads) return;
  const int d = p.head_dim;
  const float* xi = x + idx * d;
  float* yi = y + idx * d;
  float r = 1.0f;
  if (t.qk_norm) r = rsqrtf(Dot(xi, xi, d) + t.eps);
  for (int c = 0; c < d; ++c) yi[c] = xi[c] * r;
  if (!t.rope) return;
  const int64_t pos = PositionOf(p, is_query, idx / p.heads);
  for (int c = 0; c < d / 2; ++c) {
    float cs, sn;
    RopeAngle(t, pos, c, d, &cs, &sn);
    const float a = yi[c], b = yi[c + d / 2];
    yi[c] = a * cs - b * sn;
    yi[c + d / 2] = b * cs + a * sn;
  }
}

__global__ void TransformBackwardKernel(Params p, TransformArgs t, bool is_query, int64_t rows,
                                        const float* x, const float* dy, float* dx) {
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= rows * p.heads) return;
  const int d = p.head_dim;
  const float* xi = x + idx * d;
  const float* gi = dy + idx * d;
  float* o = dx + idx * d;
  for (int c = 0; c < d; ++c) o[c] = gi[c];
  if (t.rope) {  // The transpose of a rotation: rotate back.
    const int64_t pos = PositionOf(p, is_query, idx / p.heads);
    for (int c = 0; c < d / 2; ++c) {
      float cs, sn;
      RopeAngle(t, pos, c, d, &cs, &sn);
      const float a = o[c], b = o[c + d / 2];
      o[c] = a * cs + b * sn;
      o[c + d / 2] = b * cs - a * sn;
    }
  }
  if (t.qk_norm) {  // y = x r: dx = r (dn - y <y, dn>).
    const float r = rsqrtf(Dot(xi, xi, d) + t.eps);
    float ydn = 0;
    for (int c = 0; c < d; ++c) ydn += xi[c] * r * o[c];
    for (int c = 0; c < d; ++c) o[c] = r * (o[c] - xi[c] * r * ydn);
  }
}

}  // namespace

cudaError_t Forward(const Params& p, const float* q, const float* k, const float* v, float* out,
                    float* lse, void* stream) {
  if (p.total_q == 0) return cudaSuccess;
  if (p.head_dim > kMaxDim) return cudaErrorInvalidValue;
  ForwardKernel<<<dim3(static_cast<unsigned>(p.total_q), p.heads), kThreads, 0, S(stream)>>>(
      p, q, k, v, out, lse);
  return cudaGetLastError();
}

cudaError_t Backward(const Params& p, const float* q, const float* k, const float* v,
                     const float* out, const float* lse, const float* d_out, float* dq, float* dk,
                     float* dv, void* stream) {
  const size_t kv_bytes = static_cast<size_t>(p.total_k) * p.heads * p.head_dim * sizeof(float);
  if (kv_bytes > 0) {
    if (cudaError_t e = cudaMemsetAsync(dk, 0, kv_bytes, S(stream)); e != cudaSuccess) return e;
    if (cudaError_t e = cudaMemsetAsync(dv, 0, kv_bytes, S(stream)); e != cudaSuccess) return e;
  }
  if (p.total_q == 0) return cudaSuccess;
  if (p.head_dim > kMaxDim) return cudaErrorInvalidValue;
  BackwardKernel<<<dim3(static_cast<unsigned>(p.total_q), p.heads), kThreads, 0, S(stream)>>>(
      p, q, k, v, out, lse, d_out, dq, dk, dv);
  return cudaGetLastError();
}

cudaError_t Transform(const Params& p, const TransformArgs& t, bool is_query, const float* x,
                      float* y, void* stream) {
  const int64_t rows = is_query ? p.total_q : p.total_k;
  const int64_t n = rows * p.heads;
  if (n == 0) return cudaSuccess;
  TransformKernel<<<static_cast<unsigned>((n + 127) / 128), 128, 0, S(stream)>>>(p, t, is_query,
                                                                                 rows, x, y);
  return cudaGetLastError();
}

cudaError_t TransformBackward(const Params& p, const TransformArgs& t, bool is_query,
                              const float* x, const float* dy, float* dx, void* stream) {
  const int64_t rows = is_query ? p.total_q : p.total_k;
  const int64_t n = rows * p.heads;
  if (n == 0) return cudaSuccess;
  TransformBackwardKernel<<<static_cast<unsigned>((n + 127) / 128), 128, 0, S(stream)>>>(
      p, t, is_query, rows, x, dy, dx);
  return cudaGetLastError();
}

}  // namespace recfleet::attention::fp32_cuda
