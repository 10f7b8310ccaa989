#include "kernels/base/formats.h"

#include <cmath>
#include <cstring>

#include "kernels/base/minifloat.h"

namespace recfleet {

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

float Fp8E4M3ToFloat(uint8_t bits) { return minifloat::Decode(minifloat::E4M3(), bits); }
uint8_t FloatToFp8E4M3(float value) { return minifloat::Encode(minifloat::E4M3(), value); }
float Fp8E5M2ToFloat(uint8_t bits) { return minifloat::Decode(minifloat::E5M2(), bits); }
uint8_t FloatToFp8E5M2(float value) { return minifloat::Encode(minifloat::E5M2(), value); }

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
