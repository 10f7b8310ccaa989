#ifndef RECFLEET_KERNELS_BASE_FORMATS_H_
#define RECFLEET_KERNELS_BASE_FORMATS_H_

// Host-side scalar number formats shared by the CPU reference kernels:
// bf16 and the two OCP FP8 formats (E4M3 "fn" with max 448, E5M2 with max
// 57344), plus element access to a host TensorView as double. Conversions
// round to nearest, ties to even, and saturate to the largest finite value
// (the same `satfinite` behaviour the CUDA kernels use), so a CPU reference
// and a CUDA kernel that see the same float produce the same bits.
// All functions are pure and thread-safe.

#include <cstdint>

#include "kernels/tensor.h"

namespace recfleet {

float BFloat16ToFloat(uint16_t bits);
uint16_t FloatToBFloat16(float value);

float Fp8E4M3ToFloat(uint8_t bits);
uint8_t FloatToFp8E4M3(float value);
float Fp8E5M2ToFloat(uint8_t bits);
uint8_t FloatToFp8E5M2(float value);

// Largest finite magnitude of an FP8 dtype (448 or 57344); 0 for others.
float Fp8Max(DType dtype);

// Rounds `value` to `dtype` (a floating dtype) and back: what storing it in
// a tensor of that dtype would keep.
double RoundTo(DType dtype, double value);

// Element i of a host tensor of any floating dtype, widened to double.
double LoadAsDouble(const TensorView& t, int64_t i);
// Stores `value` into element i, rounding once to the tensor's dtype.
void StoreFromDouble(const TensorView& t, int64_t i, double value);
// Element i of a host int32/int64 tensor.
int64_t LoadIndex(const TensorView& t, int64_t i);

// True for fp32, fp64, bf16, fp16, fp8 (not integers).
bool IsFloating(DType dtype);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_BASE_FORMATS_H_
