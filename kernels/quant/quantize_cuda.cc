// CUDA side of quantize.h: maps validated views onto the kernels.

#include "kernels/base/checks.h"
#include "kernels/base/cuda_status.h"
#include "kernels/quant/quantize_internal.h"
#include "kernels/quant/quantize_kernels.h"

namespace recfleet::quant_internal {
namespace {

int TypeCode(const TensorView& t) { return t.dtype == DType::kBFloat16 ? 1 : 0; }
int FormatCode(DType d) { return d == DType::kFloat8E5M2 ? 2 : 1; }

}  // namespace

absl::Status QuantizeCuda(const TensorView& x, const QuantizeConfig& config, bool transpose,
                          const TensorView& q, const TensorView& scales, uint8_t* e8m0,
                          void* stream) {
  const BlockDims b = DimsOf(config.block);
  quant_cuda::QuantizeArgs a;
  a.x = x.data;
  a.x_type = TypeCode(x);
  a.rows = x.dim(0);
  a.cols = x.dim(1);
  a.block_rows = static_cast<int>(b.rows);
  a.block_cols = static_cast<int>(b.cols);
  a.pow2 = config.block == ScaleBlock::k32x32;
  a.format = FormatCode(config.format);
  quant_cuda::QuantizeTarget& t = transpose ? a.transposed : a.direct;
  t.stochastic = config.rounding == Rounding::kStochastic;
  t.seed = config.seed;
  t.q = q.as<uint8_t>();
  t.scales = scales.as<float>();
  t.e8m0 = e8m0;
  t.scale_stride_row = QuantScaleShape(q.dim(0), q.dim(1), config.block)[1];
  t.scale_stride_col = 1;
  return CudaStatus(quant_cuda::Quantize(a, stream), "FP8 quantize");
}

absl::Status DequantizeCuda(const TensorView& q, const TensorView& scales, ScaleBlock block,
                            const TensorView& x, void* stream) {
  const BlockDims b = DimsOf(block);
  return CudaStatus(quant_cuda::Dequantize(q.as<uint8_t>(), FormatCode(q.dtype), scales.as<float>(),
                                           q.dim(0), q.dim(1), static_cast<int>(b.rows),
                                           static_cast<int>(b.cols), x.data, TypeCode(x), stream),
                    "FP8 dequantize");
}

absl::Status HadamardCuda(const TensorView& x, int64_t block, uint64_t seed, bool inverse,
                          const TensorView& y, void* stream) {
  return CudaStatus(quant_cuda::Hadamard(x.data, y.data, TypeCode(x), x.numel(), x.dim(-1), block,
                                         seed, inverse, stream),
                    "random Hadamard transform");
}

absl::Status PackCuda(const TensorView& q, const TensorView& scales, ScaleBlock block,
                      void* buffer, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  char* out = static_cast<char*>(buffer);
  RECFLEET_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(out, q.data, q.nbytes(), cudaMemcpyDeviceToDevice, s), "pack payload"));
  char* dst = out + PackedScalesOffset(q.dim(0), q.dim(1));
  if (block != ScaleBlock::k32x32) {
    return CudaStatus(
        cudaMemcpyAsync(dst, scales.data, scales.nbytes(), cudaMemcpyDeviceToDevice, s),
        "pack scales");
  }
  return CudaStatus(quant_cuda::ScalesToE8M0(scales.as<float>(), reinterpret_cast<uint8_t*>(dst),
                                             scales.numel(), stream),
                    "pack E8M0 scales");
}

absl::Status UnpackCuda(const void* buffer, ScaleBlock block, const TensorView& q,
                        const TensorView& scales, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const char* in = static_cast<const char*>(buffer);
  RECFLEET_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(q.data, in, q.nbytes(), cudaMemcpyDeviceToDevice, s), "unpack payload"));
  const char* src = in + PackedScalesOffset(q.dim(0), q.dim(1));
  if (block != ScaleBlock::k32x32) {
    return CudaStatus(
        cudaMemcpyAsync(scales.data, src, scales.nbytes(), cudaMemcpyDeviceToDevice, s),
        "unpack scales");
  }
  return CudaStatus(quant_cuda::E8M0ToScales(reinterpret_cast<const uint8_t*>(src),
                                             scales.as<float>(), scales.numel(), stream),
                    "unpack E8M0 scales");
}

namespace {

quant_cuda::TiledPieceArgs ArgsOf(const TiledPiece& p) {
  quant_cuda::TiledPieceArgs a;
  a.numel = p.numel, a.start = p.start, a.cols = p.cols, a.first_tile = p.first_tile;
  return a;
}

}  // namespace

absl::Status TiledPieceAmaxCuda(const float* x, const TiledPiece& piece, float* amax, void* stream) {
  return CudaStatus(quant_cuda::TiledPieceAmax(x, ArgsOf(piece), amax, stream), "tiled piece amax");
}

absl::Status TileScalesCuda(const float* amax, int64_t n, DType format, float* scales, void* stream) {
  return CudaStatus(quant_cuda::TileScales(amax, n, FormatCode(format), scales, stream), "tile scales");
}

absl::Status QuantizeTiledPieceCuda(const float* x, const TiledPiece& piece, const float* scales,
                                    DType format, uint8_t* q, void* stream) {
  return CudaStatus(quant_cuda::QuantizeTiledPiece(x, ArgsOf(piece), scales, FormatCode(format), q, stream),
                    "tiled piece quantize");
}

absl::Status DequantizeTiledPieceCuda(const uint8_t* q, const TiledPiece& piece, const float* scales,
                                      DType format, float* x, void* stream) {
  return CudaStatus(quant_cuda::DequantizeTiledPiece(q, ArgsOf(piece), scales, FormatCode(format), x, stream),
                    "tiled piece dequantize");
}

}  // namespace recfleet::quant_internal
