#ifndef RECFLEET_KERNELS_QUANT_QUANTIZE_KERNELS_H_
#define RECFLEET_KERNELS_QUANT_QUANTIZE_KERNELS_H_

// CUDA kernels behind quantize.h with a plain interface (no absl), also
// used by the FP8 GEMM path, which needs cuBLASLt's scale layouts. Element
// codes: 0 fp32, 1 bf16; FP8 format codes: 1 E4M3, 2 E5M2. Device
// pointers; launches go to `stream` (a cudaStream_t).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace recfleet::quant_cuda {

// One FP8 output of a quantization pass.
struct QuantizeTarget {
  uint8_t* q = nullptr;  // null: this output is not written
  // Scale of q-block (bi, bj) goes to scales[bi * stride_row + bj * stride_col]
  // (fp32), or as an E8M0 byte to e8m0[...] when e8m0 is set.
  float* scales = nullptr;
  uint8_t* e8m0 = nullptr;
  int64_t scale_stride_row = 0, scale_stride_col = 1;
  bool stochastic = false;
  uint64_t seed = 0;
};

// One pass over x [rows, cols] writes quantize(x) (`direct`) and/or
// quantize(x^T) (`transposed`), each with blocks of block_rows x block_cols
// in its own orientation (1x128, 128x128 or 32x32), reading x once.
struct QuantizeArgs {
  const void* x = nullptr;
  int x_type = 0;
  int64_t rows = 0, cols = 0;  // x's shape
  int block_rows = 1, block_cols = 128;
  bool pow2 = false;  // E8M0-representable scales
  int format = 1;
  QuantizeTarget direct, transposed;
  // 1x128 blocks only: the transposed output quantizes H D x^T instead, the
  // 128-point random Hadamard transform along x's rows (in aligned groups of
  // 128 rows; D = random signs per row index, RandomSign(hadamard_seed, row)).
  bool hadamard_transposed = false;
  uint64_t hadamard_seed = 0;
  // Also x rounded to bf16 (round-to-nearest-even, x's shape, row-major)
  // into bf16_copy, by the same read of x (an FP8 layer whose weight
  // gradient is bf16 keeps it for that GEMM). Only where WritesBf16Copy.
  void* bf16_copy = nullptr;
};

// Quantize rejects a bf16_copy (cudaErrorInvalidValue) unless this holds:
// fp32 x, a direct-only 1x128 pass run by the row kernel (cols % 128 == 0,
// 16-byte aligned x and bf16_copy, 8-byte aligned q).
bool WritesBf16Copy(const QuantizeArgs& a);

cudaError_t Quantize(const QuantizeArgs& a, void* stream);

// x = decode(q) * scale, scales row-major over (block row, block column).
cudaError_t Dequantize(const uint8_t* q, int format, const float* scales, int64_t rows,
                       int64_t cols, int block_rows, int block_cols, void* x, int x_type,
                       void* stream);

cudaError_t Hadamard(const void* x, void* y, int type, int64_t numel, int64_t cols, int64_t block,
                     uint64_t seed, bool inverse, void* stream);

cudaError_t ScalesToE8M0(const float* scales, uint8_t* out, int64_t n, void* stream);
cudaError_t E8M0ToScales(const uint8_t* in, float* scales, int64_t n, void* stream);

// Pieces of 128x128-tiled matrices (quantize.h TiledPiece); x, amax and
// scales fp32, q FP8 of `format`.
struct TiledPieceArgs {
  int64_t numel = 0, start = 0, cols = 1, first_tile = 0;
};
cudaError_t TiledPieceAmax(const float* x, const TiledPieceArgs& p, float* amax, void* stream);
cudaError_t TileScales(const float* amax, int64_t n, int format, float* scales, void* stream);
cudaError_t QuantizeTiledPiece(const float* x, const TiledPieceArgs& p, const float* scales, int format,
                               uint8_t* q, void* stream);
cudaError_t DequantizeTiledPiece(const uint8_t* q, const TiledPieceArgs& p, const float* scales, int format,
                                 float* x, void* stream);

}  // namespace recfleet::quant_cuda

#endif  // RECFLEET_KERNELS_QUANT_QUANTIZE_KERNELS_H_
