#ifndef RECFLEET_KERNELS_QUANT_QUANTIZE_H_
#define RECFLEET_KERNELS_QUANT_QUANTIZE_H_

// Block-scaled FP8 quantization, the random Hadamard transform, and packing
// of quantized tensors for collectives.
//
// A [rows, cols] matrix is cut into blocks; each block gets one fp32
// *dequantization* scale s (value ~= fp8 * s, cuBLASLt's convention) and its
// elements are stored as FP8 (E4M3 by default, or E5M2). Block kinds:
//   k1x128   : 1 row x 128 columns (activations and gradients, along the
//              GEMM reduction dimension); s = amax / fmax.
//   k128x128 : 128 x 128 tiles (weights); s = amax / fmax. A matrix and its
//              transpose have the same tiles, so the FP8 data of W^T is the
//              transpose of that of W.
//   k32x32   : MX-style 32 x 32 tiles with a power-of-two (E8M0) scale, the
//              smallest power of two >= amax / fmax, so nothing saturates.
//              Also transpose-invariant; the storage/communication format.
// Edge blocks are partial (no padding). An all-zero block has scale 1.
// Scales are an fp32 tensor of shape QuantScaleShape(rows, cols, block),
// row-major over block rows then block columns.
//
// Rounding: kNearest (ties to even) or kStochastic, where each element draws
// a counter-based uniform number from (seed, element index) and rounds up with
// probability equal to its distance from the lower neighbour, so the
// dequantized value is unbiased. Both are bit-identical between CPU and CUDA.
//
// Devices: all tensors of one call on one Device; the call dispatches on it.
// CUDA work is enqueued on `stream` (cudaStream_t; nullptr = legacy default
// stream), asynchronously. Calls are reentrant.

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/tensor.h"

namespace recfleet {

enum class ScaleBlock : uint8_t { k1x128, k128x128, k32x32 };
enum class Rounding : uint8_t { kNearest, kStochastic };

absl::string_view ScaleBlockName(ScaleBlock block);  // "1x128", "128x128", "32x32"

struct QuantizeConfig {
  ScaleBlock block = ScaleBlock::k1x128;
  DType format = DType::kFloat8E4M3;  // or kFloat8E5M2
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;  // stochastic rounding only; use a new seed per step
};

// Shape of the scale tensor for a [rows, cols] matrix.
Shape QuantScaleShape(int64_t rows, int64_t cols, ScaleBlock block);

// q = quantize(x) (transpose = false) or quantize(x^T) (transpose = true).
// x [rows, cols] fp32/bf16 (fp64 on CPU); q [rows, cols] (or [cols, rows])
// fp8 of config.format; scales fp32 of QuantScaleShape(q's shape). The
// transposed form serves weight-gradient GEMMs, which reduce over the rows.
absl::Status Quantize(const TensorView& x, const QuantizeConfig& config, bool transpose,
                      const TensorView& q, const TensorView& scales, void* stream = nullptr);

// x = q * scale, elementwise; x fp32/bf16 (fp64 on CPU) of q's shape.
absl::Status Dequantize(const TensorView& q, const TensorView& scales, ScaleBlock block,
                        const TensorView& x, void* stream = nullptr);

// Random Hadamard transform along the last dimension, in independent
// segments of `block` columns (a power of two, 2..4096, dividing cols):
//   y = H D x / sqrt(block),  D = diag(random signs from `seed`, per column).
// The transform is orthonormal, so GEMMs over the transformed dimension are
// unchanged when both operands use the same seed, while outliers spread over
// the segment. inverse = true applies D H / sqrt(block), undoing the forward
// transform. x, y [rows, cols] of the same dtype (fp32/bf16; fp64 on CPU);
// y may alias x.
absl::Status RandomHadamard(const TensorView& x, int64_t block, uint64_t seed, bool inverse,
                            const TensorView& y, void* stream = nullptr);

// Packing of one quantized tensor into a flat byte buffer for a collective
// (quantize the local shard, all-gather the packed buffers, unpack each):
// the FP8 payload, then the scales (fp32, or one E8M0 byte per 32x32 block),
// each part starting at a 16-byte boundary. The layout depends only on
// (rows, cols, block), so every rank can compute every peer's size.
size_t PackedBytes(int64_t rows, int64_t cols, ScaleBlock block);

// Writes q [rows, cols] fp8 and its scales into `buffer` (PackedBytes bytes,
// on q's device, 16-byte aligned).
absl::Status PackQuantized(const TensorView& q, const TensorView& scales, ScaleBlock block,
                           void* buffer, void* stream = nullptr);

// Quantizes x (no transpose) straight into a packed buffer, the producer
// side of an FP8 all-gather.
absl::Status QuantizeAndPack(const TensorView& x, const QuantizeConfig& config, void* buffer,
                             void* stream = nullptr);

// Reads a packed buffer back into q (fp8, [rows, cols]; its dtype says the
// format) and fp32 scales of QuantScaleShape.
absl::Status UnpackQuantized(const void* buffer, ScaleBlock block, const TensorView& q,
                             const TensorView& scales, void* stream = nullptr);

// Pieces of 128x128-tiled matrices. An FSDP shard cuts weight matrices
// anywhere; these calls let each holder quantize its pieces with the tile
// scales of the whole matrices, so the pieces together carry exactly
// Quantize(w, {k128x128, format}) of each matrix (the FP8 GEMM's weight
// operand, kernels/gemm/linear.h), wherever the cuts fall:
//   1. every holder zeroes an amax array (fp32, one entry per tile of every
//      matrix) and takes TiledPieceAmax of its pieces;
//   2. the holders reduce the arrays (maximum) and TileScalesFromAmax turns
//      the result into k128x128 scales;
//   3. QuantizeTiledPiece / DequantizeTiledPiece then code each piece.
// A piece is `numel` consecutive elements of a row-major matrix of `cols`
// columns, the first at row-major index `start`; the matrix's tiles are
// entries first_tile ... first_tile + TileCount - 1 of the arrays,
// row-major over (tile row, tile column) as QuantScaleShape. The pieces'
// elements are fp32 (x, amax, scales) and FP8 (q), all on one device.
struct TiledPiece {
  int64_t numel = 0;
  int64_t start = 0;
  int64_t cols = 1;
  int64_t first_tile = 0;
};
// Tiles of a [rows, cols] matrix: QuantScaleShape(rows, cols, k128x128)'s
// product.
int64_t TileCount(int64_t rows, int64_t cols);
// amax[tile] = max(amax[tile], |x|) for each element x [piece.numel] of the
// piece (NaN elements are ignored, as Quantize's amax ignores them).
absl::Status TiledPieceAmax(const TensorView& x, const TiledPiece& piece, const TensorView& amax,
                            void* stream = nullptr);
// scales[i] = the k128x128 scale Quantize gives a tile whose absolute
// maximum is amax[i], for `format`; scales may alias amax.
absl::Status TileScalesFromAmax(const TensorView& amax, DType format, const TensorView& scales,
                                void* stream = nullptr);
// q [piece.numel] (fp8, its dtype the format) = x coded with its tile's
// scale, as Quantize codes it (round to nearest, saturating).
absl::Status QuantizeTiledPiece(const TensorView& x, const TiledPiece& piece, const TensorView& scales,
                                const TensorView& q, void* stream = nullptr);
// x [piece.numel] fp32 = decode(q) * its tile's scale, as Dequantize.
absl::Status DequantizeTiledPiece(const TensorView& q, const TiledPiece& piece, const TensorView& scales,
                                  const TensorView& x, void* stream = nullptr);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_QUANT_QUANTIZE_H_
