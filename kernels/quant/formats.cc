#include "kernels/quant/formats.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace recfleet {
namespace {

// A small IEEE-like format: `man_bits` stored mantissa bits, exponent bias
// `bias`, largest finite code `max_code` (the FP8 formats differ only in
// these). Encoding is monotonic in magnitude, so saturation is a clamp on
// the code.
struct MiniFloat {
  int man_bits;
  int bias;
  uint8_t max_code;
  uint8_t nan_code;
};

constexpr MiniFloat kE4M3{3, 7, 0x7E, 0x7F};
constexpr MiniFloat kE5M2{2, 15, 0x7B, 0x7F};

uint8_t Encode(const MiniFloat& f, float value) {
  if (std::isnan(value)) return f.nan_code;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(value));
  const int min_exp = 1 - f.bias;  // exponent of the smallest normal
  uint32_t code;
  if (a < std::ldexp(1.0, min_exp)) {
    // Subnormal range: a multiple of 2^(min_exp - man_bits). A rounded
    // value of 2^man_bits is exactly the smallest normal's code.
    code = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, f.man_bits - min_exp)));
  } else if (std::isinf(a)) {
    code = f.max_code;
  } else {
    int e;
    const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
    const int exp = e - 1;               // a = (2m) * 2^exp, 2m in [1, 2)
    if (exp + f.bias > 30) {
      code = f.max_code;
    } else {
      uint32_t q = static_cast<uint32_t>(std::nearbyint((2 * m - 1) * (1 << f.man_bits)));
      // q == 2^man_bits carries into the exponent, which the packed
      // encoding does by itself.
      code = (static_cast<uint32_t>(exp + f.bias) << f.man_bits) + q;
    }
  }
  if (code > f.max_code) code = f.max_code;
  return sign | static_cast<uint8_t>(code);
}

float Decode(const MiniFloat& f, uint8_t bits) {
  const bool neg = bits & 0x80;
  const uint8_t mag = bits & 0x7F;
  if (mag == f.nan_code || (f.max_code == 0x7B && mag > 0x7B && mag != 0x7C)) {
    return std::numeric_limits<float>::quiet_NaN();
  }
  if (f.max_code == 0x7B && mag == 0x7C) {
    return neg ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  }
  const int exp_field = mag >> f.man_bits;
  const int man = mag & ((1 << f.man_bits) - 1);
  double v;
  if (exp_field == 0) {
    v = std::ldexp(static_cast<double>(man), 1 - f.bias - f.man_bits);
  } else {
    v = std::ldexp(1.0 + static_cast<double>(man) / (1 << f.man_bits), exp_field - f.bias);
  }
  return static_cast<float>(neg ? -v : v);
}

}  // namespace

float BFloat16ToFloat(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToBFloat16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  if (std::isnan(value)) return static_cast<uint16_t>((u >> 16) | 0x40);
  const uint32_t rounding_bias = 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

float Fp8E4M3ToFloat(uint8_t bits) { return Decode(kE4M3, bits); }
uint8_t FloatToFp8E4M3(float value) { return Encode(kE4M3, value); }
float Fp8E5M2ToFloat(uint8_t bits) { return Decode(kE5M2, bits); }
uint8_t FloatToFp8E5M2(float value) { return Encode(kE5M2, value); }

float Fp8Max(DType dtype) {
  switch (dtype) {
    case DType::kFloat8E4M3: return 448.0f;
    case DType::kFloat8E5M2: return 57344.0f;
    default: return 0.0f;
  }
}

bool IsFloating(DType dtype) {
  return dtype != DType::kInt32 && dtype != DType::kInt64;
}

double RoundTo(DType dtype, double value) {
  switch (dtype) {
    case DType::kFloat64: return value;
    case DType::kFloat32: return static_cast<float>(value);
    case DType::kBFloat16: return BFloat16ToFloat(FloatToBFloat16(static_cast<float>(value)));
    case DType::kFloat16: return static_cast<double>(static_cast<_Float16>(static_cast<float>(value)));
    case DType::kFloat8E4M3: return Fp8E4M3ToFloat(FloatToFp8E4M3(static_cast<float>(value)));
    case DType::kFloat8E5M2: return Fp8E5M2ToFloat(FloatToFp8E5M2(static_cast<float>(value)));
    default: return value;
  }
}

double LoadAsDouble(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kFloat64: return t.as<const double>()[i];
    case DType::kFloat32: return t.as<const float>()[i];
    case DType::kBFloat16: return BFloat16ToFloat(t.as<const uint16_t>()[i]);
    case DType::kFloat16: return static_cast<double>(t.as<const _Float16>()[i]);
    case DType::kFloat8E4M3: return Fp8E4M3ToFloat(t.as<const uint8_t>()[i]);
    case DType::kFloat8E5M2: return Fp8E5M2ToFloat(t.as<const uint8_t>()[i]);
    case DType::kInt32: return t.as<const int32_t>()[i];
    case DType::kInt64: return static_cast<double>(t.as<const int64_t>()[i]);
  }
  return 0;
}

void StoreFromDouble(const TensorView& t, int64_t i, double value) {
  switch (t.dtype) {
    case DType::kFloat64: t.as<double>()[i] = value; return;
    case DType::kFloat32: t.as<float>()[i] = static_cast<float>(value); return;
    case DType::kBFloat16: t.as<uint16_t>()[i] = FloatToBFloat16(static_cast<float>(value)); return;
    case DType::kFloat16: t.as<_Float16>()[i] = static_cast<_Float16>(static_cast<float>(value)); return;
    case DType::kFloat8E4M3: t.as<uint8_t>()[i] = FloatToFp8E4M3(static_cast<float>(value)); return;
    case DType::kFloat8E5M2: t.as<uint8_t>()[i] = FloatToFp8E5M2(static_cast<float>(value)); return;
    case DType::kInt32: t.as<int32_t>()[i] = static_cast<int32_t>(value); return;
    case DType::kInt64: t.as<int64_t>()[i] = static_cast<int64_t>(value); return;
  }
}

int64_t LoadIndex(const TensorView& t, int64_t i) {
  return t.dtype == DType::kInt32 ? t.as<const int32_t>()[i] : t.as<const int64_t>()[i];
}

}  // namespace recfleet
