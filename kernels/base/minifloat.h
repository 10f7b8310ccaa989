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
#include <cstring>

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

RECFLEET_HD float BitsToFloat(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
#endif
}

RECFLEET_HD uint32_t FloatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
#endif
}

// 2^e for a normal fp32 exponent e.
RECFLEET_HD float Pow2(int e) { return BitsToFloat(static_cast<uint32_t>(127 + e) << 23); }

// Largest finite magnitude of a format (E4M3 448, E5M2 57344).
RECFLEET_HD float MaxFinite(const Spec& s) { return s.max_code == 0x7B ? 57344.0f : 448.0f; }

// StochasticSnap (below) for a finite x with |x| >= 2^(1 - bias), the
// smallest normal: x clamped to +-MaxFinite, then the top bits of r added
// under the kept mantissa of its sign-magnitude bits and the rest truncated
// (a carry moves into the exponent by itself; the clamp keeps it finite).
RECFLEET_HD float StochasticSnapNormal(const Spec& s, float x, uint32_t r) {
  const float fmax = MaxFinite(s);
  x = fminf(fmaxf(x, -fmax), fmax);
  const int drop = 23 - s.man_bits;  // fp32 mantissa bits below the kept ones
  const uint32_t mask = (1u << drop) - 1u;
  return BitsToFloat((FloatToBits(x) + (r >> (32 - drop))) & ~mask);
}

// The kernels' fast path: StochasticSnapNormal without the clamp (an add and
// a logic operation). For a finite x with 2^(1 - bias) <= |x| < 2^126 the
// result may exceed MaxFinite, but a saturating encoder (Encode, the packed
// cvt.rn.satfinite) then gives the same code as for the clamped snap: values
// past MaxFinite encode as it, and no carry reaches the fp32 exponent's
// all-ones field.
RECFLEET_HD float StochasticSnapNormalUnclamped(const Spec& s, float x, uint32_t r) {
  const int drop = 23 - s.man_bits;
  const uint32_t mask = (1u << drop) - 1u;
  return BitsToFloat((FloatToBits(x) + (r >> (32 - drop))) & ~mask);
}

// Stochastic rounding of x onto the format's grid, as an fp32 value the
// format represents exactly (so that a nearest-even encoder, scalar or
// packed, then encodes it without rounding), saturated to +-MaxFinite (an
// infinity too); NaN stays NaN. `r` is 32 uniform random bits. Between the
// two neighbours lo <= |x| < hi it picks hi with probability
// (|x| - lo) / (hi - lo) at a resolution of 2^-16 (RandomBits gives 16
// random bits), so E[result] = x below saturation, within 2^-16 of the
// spacing. Normals take StochasticSnapNormal; subnormals, whose spacing
// is fixed, compare the fraction of |x| in units of that spacing with the
// top 24 bits of r.
// Integer adds and exact scalings only (no decode of neighbouring codes):
// the same bits on CPU and GPU.
RECFLEET_HD float StochasticSnap(const Spec& s, float x, uint32_t r) {
  if (std::isnan(x)) return x;
  const int min_exp = 1 - s.bias;
  const float a = fabsf(x);
  if (a >= Pow2(min_exp)) return StochasticSnapNormal(s, x, r);
  const float q = a * Pow2(s.man_bits - min_exp);  // in units of the subnormal spacing
  const float qi = floorf(q);
  const float up = static_cast<float>(r >> 8) < (q - qi) * 16777216.0f ? 1.0f : 0.0f;
  const float y = (qi + up) * Pow2(min_exp - s.man_bits);
  return BitsToFloat(FloatToBits(y) | (FloatToBits(x) & 0x80000000u));
}

RECFLEET_HD uint8_t Encode(const Spec& s, float x) {
  if (std::isnan(x)) return kNaNCode;
#if defined(__CUDA_ARCH__)
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, s.max_code == 0x7B ? __NV_E5M2 : __NV_E4M3);
#endif
  const uint32_t sign = std::signbit(x) ? 0x80u : 0u;
  return static_cast<uint8_t>(sign | EncodeMagnitudeNearest(s, fabsf(x)));
}

// Stochastic rounding to a code (see StochasticSnap).
RECFLEET_HD uint8_t EncodeStochastic(const Spec& s, float x, uint32_t r) {
  return Encode(s, StochasticSnap(s, x, r));
}

#if defined(__CUDACC__)
// Four round-to-nearest codes, byte j from y[j], by two packed conversions
// (the same cvt.rn.satfinite as Encode; device only). For finite y: the
// packed conversion's NaN code need not be kNaNCode.
__device__ __forceinline__ uint32_t EncodeNearest4(const float* y, bool e5m2) {
  const __nv_fp8_interpretation_t f = e5m2 ? __NV_E5M2 : __NV_E4M3;
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(y[0], y[1]), __NV_SATFINITE, f);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(y[2], y[3]), __NV_SATFINITE, f);
  return lo | hi << 16;
}

// Eight round-to-nearest codes of y as two words (byte j of word h from
// y[4 h + j]): the packed conversions, or the scalar Encode when a y is
// NaN or infinite (y * 0 is then NaN), so NaN gets kNaNCode as on the host.
__device__ __forceinline__ uint2 EncodeNearest8(const float* y, bool e5m2) {
  float probe = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) probe = fmaf(y[j], 0.0f, probe);
  if (probe == 0.0f) return make_uint2(EncodeNearest4(y, e5m2), EncodeNearest4(y + 4, e5m2));
  const Spec spec = e5m2 ? E5M2() : E4M3();
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    w[j / 4] |= static_cast<uint32_t>(Encode(spec, y[j])) << (8 * (j % 4));
  }
  return make_uint2(w[0], w[1]);
}
#endif

// 32-bit integer finalizer (Wellons' lowbias32): a bijection whose output
// bits each depend on every input bit.
RECFLEET_HD uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// Counter-based random bits for stochastic rounding: RandomBits(key, index)
// with key = RandomKey(seed). Elements 2k and 2k + 1 share one 32-bit
// finalizer (PairHash(key, k), two multiplies) and take 16 bits each: the
// even element the high half, the odd one the low half, returned in the top
// 16 bits of the word (the low 16 are zero). Kernels hash the seed once and
// each pair of elements costs one finalizer. The same on every device and
// for any launch shape, so stochastic rounding is reproducible.
RECFLEET_HD uint32_t RandomKey(uint64_t seed) {
  return Mix32(static_cast<uint32_t>(seed) ^
               Mix32(static_cast<uint32_t>(seed >> 32) + 0x9E3779B9u));
}

RECFLEET_HD uint32_t PairHash(uint32_t key, uint64_t pair) {
  return Mix32((static_cast<uint32_t>(pair) ^ key) +
               static_cast<uint32_t>(pair >> 32) * 0x9E3779B9u);
}

// The half of a pair's hash that belongs to the even (odd == false) or odd
// element, in the top 16 bits.
RECFLEET_HD uint32_t PairHalf(uint32_t h, bool odd) { return odd ? h << 16 : h & 0xFFFF0000u; }

RECFLEET_HD uint32_t RandomBits(uint32_t key, uint64_t index) {
  return PairHalf(PairHash(key, index >> 1), (index & 1) != 0);
}

// Counter-based uniform [0, 1) draw for element `index` under `seed`
// (splitmix64 finalizer, 24 bits), for the random Hadamard signs: the same
// on every device and for any launch shape.
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

// The smallest power of two >= r for a finite r >= 0 (r = 0 gives 1), its
// exponent clamped to [-127, 127] (2^-127 is subnormal), read off r's bits:
// no frexp/ldexp, which cost the 32x32 kernels tens of instructions per
// scale. Equal to ldexp(1, p) with p = e - 1 if m == 0.5 else e, where
// frexp(r) = (m, e), clamped (quantize_test checks the two agree).
RECFLEET_HD float Pow2AtLeast(float r) {
  if (r == 0.0f) return 1.0f;  // frexp's exponent of zero is 0
  const uint32_t b = FloatToBits(r);
  const int exp = static_cast<int>(b >> 23);  // r >= 0: no sign bit
  const uint32_t man = b & 0x7FFFFFu;
  int p;
  if (exp == 0) {
    p = man > 0x400000u ? -126 : -127;  // subnormal: r = man * 2^-149
  } else {
    p = exp - 127 + (man != 0 ? 1 : 0);
  }
  if (p > 127) p = 127;
  return p == -127 ? BitsToFloat(0x400000u) : Pow2(p);
}

// Dequantization scale of a block with absolute maximum `amax` for a format
// whose largest finite value is `fmax`: amax / fmax (fp32), or 1 for an
// all-zero block. Elements are encoded as x * (1 / scale), the reciprocal
// taken once per block in fp32 (see Reciprocal). With `power_of_two`, the smallest power of two >= that
// ratio (an E8M0 value, exponent clamped to [-127, 127]), so the block never
// saturates and its scale survives any exact transposition or packing.
// Otherwise the ratio is raised to the smallest normal fp32, 2^-126: below
// it (amax < fmax * 2^-126, e.g. the gradients of a nearly unused expert)
// the reciprocal would overflow to infinity and a zero element would encode
// 0 * inf = NaN. At 2^-126 every |x| * 2^126 stays below fmax, so nothing
// saturates either; such a block only uses less of the format's range.
RECFLEET_HD float BlockScale(float amax, float fmax, bool power_of_two) {
  if (!(amax > 0.0f) || std::isinf(amax)) return 1.0f;
  const float r = amax / fmax;
  if (power_of_two) return Pow2AtLeast(r);
  constexpr float kMinNormal = 1.17549435e-38f;  // 2^-126
  return r < kMinNormal ? kMinNormal : r;
}

// The per-block multiplier applied before encoding: 1 / scale, rounded to
// fp32 once, so that every element costs one multiply.
RECFLEET_HD float Reciprocal(float scale) { return 1.0f / scale; }

}  // namespace recfleet::minifloat

#endif  // RECFLEET_KERNELS_BASE_MINIFLOAT_H_
