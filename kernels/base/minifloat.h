#ifndef RECFLEET_KERNELS_BASE_MINIFLOAT_H_
#define RECFLEET_KERNELS_BASE_MINIFLOAT_H_

// FP8 encoding shared by the CPU references and the CUDA kernels (every
// function is __host__ __device__ under nvcc), so both devices produce the
// same bits for the same float input: round-to-nearest-even or stochastic
// rounding, saturating to the largest finite value. On the device the
// nearest-even conversions use the hardware's cvt.rn.satfinite, which
// computes the same function as the portable code used on the host (the
// GPU tests check bit equality).

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#define RECFLEET_HD __host__ __device__ __forceinline__
#else
#define RECFLEET_HD inline
#endif

namespace recfleet::minifloat {

// An FP8 layout: stored mantissa bits, exponent bias and the largest finite
// magnitude code (E4M3: 0x7E = 448, E5M2: 0x7B = 57344); NaN is 0x7F in both.
struct Spec {
  int man_bits;
  int bias;
  uint32_t max_code;
};

// Functions rather than constants so that device code can use them.
RECFLEET_HD constexpr Spec E4M3() { return Spec{3, 7, 0x7E}; }
RECFLEET_HD constexpr Spec E5M2() { return Spec{2, 15, 0x7B}; }
constexpr uint8_t kNaNCode = 0x7F;

// Magnitude of a non-NaN code without its sign bit (E5M2's 0x7C is +inf).
RECFLEET_HD float DecodeMagnitude(const Spec& s, uint32_t mag) {
#if defined(__CUDA_ARCH__)
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(
      static_cast<__nv_fp8_storage_t>(mag), s.max_code == 0x7B ? __NV_E5M2 : __NV_E4M3)));
#endif
  if (s.max_code == 0x7B && mag == 0x7C) return INFINITY;
  const int exp_field = static_cast<int>(mag >> s.man_bits);
  const int man = static_cast<int>(mag & ((1u << s.man_bits) - 1));
  if (exp_field == 0) return ldexpf(static_cast<float>(man), 1 - s.bias - s.man_bits);
  return ldexpf(1.0f + static_cast<float>(man) / static_cast<float>(1 << s.man_bits),
                exp_field - s.bias);
}

RECFLEET_HD float Decode(const Spec& s, uint8_t bits) {
  const uint32_t mag = bits & 0x7Fu;
  if (mag == kNaNCode || (s.max_code == 0x7B && mag > 0x7C)) return NAN;
  const float v = DecodeMagnitude(s, mag);
  return (bits & 0x80u) ? -v : v;
}

// Round-to-nearest-even code of a magnitude a >= 0 (not NaN), saturated.
RECFLEET_HD uint32_t EncodeMagnitudeNearest(const Spec& s, float a) {
#if defined(__CUDA_ARCH__)
  return __nv_cvt_float_to_fp8(a, __NV_SATFINITE, s.max_code == 0x7B ? __NV_E5M2 : __NV_E4M3);
#endif
  const int min_exp = 1 - s.bias;  // exponent of the smallest normal
  uint32_t code;
  if (a < ldexpf(1.0f, min_exp)) {
    // Subnormals are multiples of 2^(min_exp - man_bits); a rounded value of
    // 2^man_bits is the smallest normal's code, so no special case.
    code = static_cast<uint32_t>(rintf(ldexpf(a, s.man_bits - min_exp)));
  } else if (std::isinf(a)) {
    code = s.max_code;
  } else {
    int e;
    const float m = frexpf(a, &e);  // a = m * 2^e, m in [0.5, 1)
    const int exp = e - 1;
    if (exp + s.bias > 30) {
      code = s.max_code;
    } else {
      // A mantissa that rounds up to 2^man_bits carries into the exponent,
      // which the packed encoding does by itself.
      code = (static_cast<uint32_t>(exp + s.bias) << s.man_bits) +
             static_cast<uint32_t>(rintf((2.0f * m - 1.0f) * static_cast<float>(1 << s.man_bits)));
    }
  }
  return code > s.max_code ? s.max_code : code;
}

// Stochastic rounding of a >= 0 between its two neighbouring codes, with
// P(up) = (a - lo) / (hi - lo), so E[decode] = a below saturation. `u` is
// uniform in [0, 1).
RECFLEET_HD uint32_t EncodeMagnitudeStochastic(const Spec& s, float a, float u) {
  const uint32_t near = EncodeMagnitudeNearest(s, a);
  const float v = DecodeMagnitude(s, near);
  if (v == a || (near == s.max_code && a >= v)) return near;
  uint32_t lo = near, hi = near;
  if (v > a) {
    lo = near - 1;
  } else {
    hi = near + 1;
  }
  const float vlo = DecodeMagnitude(s, lo), vhi = DecodeMagnitude(s, hi);
  return u * (vhi - vlo) < (a - vlo) ? hi : lo;
}

RECFLEET_HD uint8_t Encode(const Spec& s, float x) {
  if (std::isnan(x)) return kNaNCode;
#if defined(__CUDA_ARCH__)
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, s.max_code == 0x7B ? __NV_E5M2 : __NV_E4M3);
#endif
  const uint32_t sign = std::signbit(x) ? 0x80u : 0u;
  return static_cast<uint8_t>(sign | EncodeMagnitudeNearest(s, fabsf(x)));
}

RECFLEET_HD uint8_t EncodeStochastic(const Spec& s, float x, float u) {
  if (std::isnan(x)) return kNaNCode;
  const uint32_t sign = std::signbit(x) ? 0x80u : 0u;
  return static_cast<uint8_t>(sign | EncodeMagnitudeStochastic(s, fabsf(x), u));
}

// Counter-based uniform [0, 1) draw for element `index` under `seed`
// (splitmix64 finalizer, 24 bits): the same on every device and for any
// launch shape, so stochastic rounding is reproducible.
RECFLEET_HD float UniformFromCounter(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

// Random sign (+1 or -1) of column `col` for the random Hadamard transform.
RECFLEET_HD float RandomSign(uint64_t seed, int64_t col) {
  return UniformFromCounter(seed ^ 0x5DEECE66Dull, static_cast<uint64_t>(col)) < 0.5f ? -1.0f
                                                                                     : 1.0f;
}

// Dequantization scale of a block with absolute maximum `amax` for a format
// whose largest finite value is `fmax`: amax / fmax (fp32), or 1 for an
// all-zero block. Elements are encoded as x * (1 / scale), the reciprocal
// taken once per block in fp32 (see Reciprocal). With `power_of_two`, the smallest power of two >= that
// ratio (an E8M0 value, exponent clamped to [-127, 127]), so the block never
// saturates and its scale survives any exact transposition or packing.
RECFLEET_HD float BlockScale(float amax, float fmax, bool power_of_two) {
  if (!(amax > 0.0f) || std::isinf(amax)) return 1.0f;
  const float r = amax / fmax;
  if (!power_of_two) return r;
  int e;
  const float m = frexpf(r, &e);  // r = m * 2^e, m in [0.5, 1)
  int p = m == 0.5f ? e - 1 : e;
  p = p < -127 ? -127 : (p > 127 ? 127 : p);
  return ldexpf(1.0f, p);
}

// The per-block multiplier applied before encoding: 1 / scale, rounded to
// fp32 once, so that every element costs one multiply.
RECFLEET_HD float Reciprocal(float scale) { return 1.0f / scale; }

}  // namespace recfleet::minifloat

#endif  // RECFLEET_KERNELS_BASE_MINIFLOAT_H_
