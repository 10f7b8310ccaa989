#ifndef RECFLEET_KERNELS_QUANT_QUANTIZE_INTERNAL_H_
#define RECFLEET_KERNELS_QUANT_QUANTIZE_INTERNAL_H_

// Device implementations behind quantize.h (arguments validated by the
// dispatcher) and the layout arithmetic both devices share.

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/quant/quantize.h"
#include "kernels/tensor.h"

namespace recfleet::quant_internal {

struct BlockDims {
  int64_t rows, cols;
};
BlockDims DimsOf(ScaleBlock block);

// E8M0 byte of a power-of-two scale, and back.
uint8_t ToE8M0(float pow2_scale);
float FromE8M0(uint8_t bits);

// Byte offset of the scales inside a packed buffer, and their byte size.
size_t PackedScalesOffset(int64_t rows, int64_t cols);
size_t PackedScalesBytes(int64_t rows, int64_t cols, ScaleBlock block);

// With `e8m0` set (32x32 blocks only), the scales are written there as E8M0
// bytes instead of to `scales`, whose data may then be null.
absl::Status QuantizeCpu(const TensorView& x, const QuantizeConfig& config, bool transpose,
                         const TensorView& q, const TensorView& scales, uint8_t* e8m0);
absl::Status DequantizeCpu(const TensorView& q, const TensorView& scales, ScaleBlock block,
                           const TensorView& x);
absl::Status HadamardCpu(const TensorView& x, int64_t block, uint64_t seed, bool inverse,
                         const TensorView& y);
absl::Status PackCpu(const TensorView& q, const TensorView& scales, ScaleBlock block, void* buffer);
absl::Status UnpackCpu(const void* buffer, ScaleBlock block, const TensorView& q,
                       const TensorView& scales);

absl::Status QuantizeCuda(const TensorView& x, const QuantizeConfig& config, bool transpose,
                          const TensorView& q, const TensorView& scales, uint8_t* e8m0,
                          void* stream);
absl::Status DequantizeCuda(const TensorView& q, const TensorView& scales, ScaleBlock block,
                            const TensorView& x, void* stream);
absl::Status HadamardCuda(const TensorView& x, int64_t block, uint64_t seed, bool inverse,
                          const TensorView& y, void* stream);
absl::Status PackCuda(const TensorView& q, const TensorView& scales, ScaleBlock block,
                      void* buffer, void* stream);
absl::Status UnpackCuda(const void* buffer, ScaleBlock block, const TensorView& q,
                        const TensorView& scales, void* stream);

// The tiled-piece calls on validated arguments (quantize.h TiledPiece).
absl::Status TiledPieceAmaxCpu(const float* x, const TiledPiece& piece, float* amax);
absl::Status TileScalesCpu(const float* amax, int64_t n, DType format, float* scales);
absl::Status QuantizeTiledPieceCpu(const float* x, const TiledPiece& piece, const float* scales,
                                   DType format, uint8_t* q);
absl::Status DequantizeTiledPieceCpu(const uint8_t* q, const TiledPiece& piece, const float* scales,
                                     DType format, float* x);
absl::Status TiledPieceAmaxCuda(const float* x, const TiledPiece& piece, float* amax, void* stream);
absl::Status TileScalesCuda(const float* amax, int64_t n, DType format, float* scales, void* stream);
absl::Status QuantizeTiledPieceCuda(const float* x, const TiledPiece& piece, const float* scales,
                                    DType format, uint8_t* q, void* stream);
absl::Status DequantizeTiledPieceCuda(const uint8_t* q, const TiledPiece& piece, const float* scales,
                                      DType format, float* x, void* stream);

}  // namespace recfleet::quant_internal

#endif  // RECFLEET_KERNELS_QUANT_QUANTIZE_INTERNAL_H_
