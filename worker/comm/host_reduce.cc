#include "worker/comm/host_reduce.h"

#include <algorithm>
#include <cstring>

namespace recfleet {
namespace comm {

float Bf16ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

uint16_t FloatToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // Keep NaN a quiet NaN.
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

namespace {

template <typename T>
T Apply(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return a + b;
  }
  return a;
}

template <typename T>
void CombineTyped(ReduceOp op, void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = Apply(op, x[i], y[i]);
}

void CombineBf16(ReduceOp op, void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = FloatToBf16(Apply(op, Bf16ToFloat(x[i]), Bf16ToFloat(y[i])));
}

}  // namespace

void CombineHost(DType dtype, ReduceOp op, void* out, const void* a, const void* b, size_t n) {
  switch (dtype) {
    case DType::kFloat32: return CombineTyped<float>(op, out, a, b, n);
    case DType::kFloat64: return CombineTyped<double>(op, out, a, b, n);
    case DType::kInt32: return CombineTyped<int32_t>(op, out, a, b, n);
    case DType::kInt64: return CombineTyped<int64_t>(op, out, a, b, n);
    case DType::kBFloat16: return CombineBf16(op, out, a, b, n);
    default: return;  // Rejected by CheckCollectiveDType before any call.
  }
}

void ScaleInPlace(DType dtype, void* x, size_t n, double factor) {
  switch (dtype) {
    case DType::kFloat32: {
      float* p = static_cast<float*>(x);
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(p[i] * factor);
      return;
    }
    case DType::kFloat64: {
      double* p = static_cast<double*>(x);
      for (size_t i = 0; i < n; ++i) p[i] *= factor;
      return;
    }
    case DType::kBFloat16: {
      uint16_t* p = static_cast<uint16_t*>(x);
      for (size_t i = 0; i < n; ++i) p[i] = FloatToBf16(static_cast<float>(Bf16ToFloat(p[i]) * factor));
      return;
    }
    default: return;  // kAvg on integers is rejected before any call.
  }
}

}  // namespace comm
}  // namespace recfleet
