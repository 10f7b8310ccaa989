#ifndef RECFLEET_KERNELS_BASE_CUDA_UTIL_H_
#define RECFLEET_KERNELS_BASE_CUDA_UTIL_H_

// Small device helpers shared by the CUDA kernels of embedding, norm, gemm
// and quant: element loads/stores that widen to fp32 and round once on the
// way back, and warp reductions. Header-only; include only from .cu files.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace recfleet::cuda_util {

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Loads V consecutive elements at p (16-byte aligned when V * sizeof(T) ==
// 16) into fp32 registers.
template <typename T, int V>
__device__ __forceinline__ void LoadVec(const T* __restrict__ p, float (&out)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = ToFloat(e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = ToFloat(p[i]);
  }
}

template <typename T, int V>
__device__ __forceinline__ void StoreVec(T* __restrict__ p, const float (&in)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < V; ++i) e[i] = FromFloat<T>(in[i]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = FromFloat<T>(in[i]);
  }
}

// The two bf16 values packed in w (low half first) as fp32: a bf16 is the
// top half of the fp32 with the same value, so one shift or mask each (the
// intrinsic conversion takes a permute and a multiply for the high half).
__device__ __forceinline__ void WidenBf16x2(uint32_t w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xFFFF0000u);
}

// 8 consecutive elements as loaded, before widening: one uint4 of bf16 or
// two float4 of fp32. Streaming kernels issue all of a thread's loads into
// these before converting any, so the loads are in flight together.
template <typename T>
struct Raw8 {
  using Vec = typename std::conditional<sizeof(T) == 4, float4, uint4>::type;
  Vec p[sizeof(T) / 2];
};

// Loads 8 elements at p (16-byte aligned) when `valid`, zeros otherwise.
template <typename T>
__device__ __forceinline__ Raw8<T> LoadRaw8(const T* p, bool valid) {
  using Vec = typename Raw8<T>::Vec;
  Raw8<T> r;
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(T)) / 2; ++k) {
    r.p[k] = valid ? __ldg(reinterpret_cast<const Vec*>(p) + k) : Vec{};
  }
  return r;
}

template <typename T>
__device__ __forceinline__ void Widen8(const Raw8<T>& raw, float (&out)[8]) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = raw.p[0], b = raw.p[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else {
    const uint4 w = raw.p[0];
    WidenBf16x2(w.x, out[0], out[1]);
    WidenBf16x2(w.y, out[2], out[3]);
    WidenBf16x2(w.z, out[4], out[5]);
    WidenBf16x2(w.w, out[6], out[7]);
  }
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Index i of an int32 or int64 array, as int64.
__device__ __forceinline__ int64_t LoadIndex(const void* p, bool is64, int64_t i) {
  return is64 ? __ldg(static_cast<const long long*>(p) + i)
              : static_cast<int64_t>(__ldg(static_cast<const int*>(p) + i));
}

// Element dtypes a kernel can take as a run-time switch where a template
// parameter per dtype would multiply instantiations for little speed.
enum class ElemType : int { kFloat32 = 0, kBFloat16 = 1 };

__device__ __forceinline__ float LoadF(const void* p, ElemType t, int64_t i) {
  return t == ElemType::kBFloat16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i])
                                  : static_cast<const float*>(p)[i];
}

__device__ __forceinline__ void StoreF(void* p, ElemType t, int64_t i, float v) {
  if (t == ElemType::kBFloat16) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

inline unsigned GridFor(int64_t work, int64_t per_block) {
  return static_cast<unsigned>((work + per_block - 1) / per_block);
}

}  // namespace recfleet::cuda_util

#endif  // RECFLEET_KERNELS_BASE_CUDA_UTIL_H_
