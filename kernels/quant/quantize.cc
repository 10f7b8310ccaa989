#include "kernels/quant/quantize.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/base/checks.h"
#include "kernels/quant/quantize_internal.h"

namespace recfleet {
namespace quant_internal {

BlockDims DimsOf(ScaleBlock block) {
  switch (block) {
    case ScaleBlock::k1x128: return {1, 128};
    case ScaleBlock::k128x128: return {128, 128};
    case ScaleBlock::k32x32: return {32, 32};
  }
  return {1, 1};
}

size_t PackedScalesOffset(int64_t rows, int64_t cols) {
  return (static_cast<size_t>(rows) * static_cast<size_t>(cols) + 15) / 16 * 16;
}

size_t PackedScalesBytes(int64_t rows, int64_t cols, ScaleBlock block) {
  const Shape s = QuantScaleShape(rows, cols, block);
  const size_t n = static_cast<size_t>(s[0] * s[1]);
  return block == ScaleBlock::k32x32 ? n : n * sizeof(float);
}

uint8_t ToE8M0(float pow2_scale) {
  int e;
  std::frexp(pow2_scale, &e);  // 2^p = 0.5 * 2^(p + 1)
  return static_cast<uint8_t>(e - 1 + 127);
}

float FromE8M0(uint8_t bits) { return std::ldexp(1.0f, static_cast<int>(bits) - 127); }

}  // namespace quant_internal

namespace {

using namespace quant_internal;  // NOLINT: the dispatcher calls every implementation

absl::Status CheckMatrix(const TensorView& t, absl::string_view what) {
  RECFLEET_RETURN_IF_ERROR(CheckRank(t, what, 2));
  if (t.dim(0) < 1 || t.dim(1) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be a non-empty matrix, got ", t.DebugString()));
  }
  return absl::OkStatus();
}

absl::Status CheckFp8(const TensorView& q, absl::string_view what, const TensorView& ref) {
  RECFLEET_RETURN_IF_ERROR(CheckDevice(q, what, ref.device));
  RECFLEET_RETURN_IF_ERROR(CheckDType(q, what, {DType::kFloat8E4M3, DType::kFloat8E5M2}));
  return CheckMatrix(q, what);
}

absl::Status CheckScales(const TensorView& scales, const TensorView& q, ScaleBlock block) {
  RECFLEET_RETURN_IF_ERROR(CheckDevice(scales, "scales", q.device));
  RECFLEET_RETURN_IF_ERROR(CheckDType(scales, "scales", {DType::kFloat32}));
  const Shape want = QuantScaleShape(q.dim(0), q.dim(1), block);
  if (scales.shape != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scales must be fp32[", want[0], ", ", want[1], "] for ", ScaleBlockName(block),
        " blocks of ", q.DebugString(), ", got ", scales.DebugString()));
  }
  return absl::OkStatus();
}

absl::Status CheckBuffer(const void* buffer, Device device) {
  if (buffer == nullptr || reinterpret_cast<uintptr_t>(buffer) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "packed buffer must be a non-null, 16-byte aligned ", DeviceName(device), " pointer"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view ScaleBlockName(ScaleBlock block) {
  switch (block) {
    case ScaleBlock::k1x128: return "1x128";
    case ScaleBlock::k128x128: return "128x128";
    case ScaleBlock::k32x32: return "32x32";
  }
  return "unknown";
}

Shape QuantScaleShape(int64_t rows, int64_t cols, ScaleBlock block) {
  const BlockDims b = DimsOf(block);
  return {(rows + b.rows - 1) / b.rows, (cols + b.cols - 1) / b.cols};
}

absl::Status Quantize(const TensorView& x, const QuantizeConfig& config, bool transpose,
                      const TensorView& q, const TensorView& scales, void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckMatrix(x, "x"));
  RECFLEET_RETURN_IF_ERROR(CheckComputeDType(x, "x"));
  RECFLEET_RETURN_IF_ERROR(CheckFp8(q, "q", x));
  if (q.dtype != config.format) {
    return absl::InvalidArgumentError(absl::StrCat("q must have the configured format ",
                                                   DTypeName(config.format), ", got ",
                                                   q.DebugString()));
  }
  const int64_t rows = transpose ? x.dim(1) : x.dim(0), cols = transpose ? x.dim(0) : x.dim(1);
  RECFLEET_RETURN_IF_ERROR(CheckDim(q, "q", 0, rows));
  RECFLEET_RETURN_IF_ERROR(CheckDim(q, "q", 1, cols));
  RECFLEET_RETURN_IF_ERROR(CheckScales(scales, q, config.block));
  if (x.device == Device::kCpu) return QuantizeCpu(x, config, transpose, q, scales, nullptr);
  return QuantizeCuda(x, config, transpose, q, scales, nullptr, stream);
}

absl::Status Dequantize(const TensorView& q, const TensorView& scales, ScaleBlock block,
                        const TensorView& x, void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckFp8(q, "q", q));
  RECFLEET_RETURN_IF_ERROR(CheckScales(scales, q, block));
  RECFLEET_RETURN_IF_ERROR(CheckSameShape(x, "x", q, "q"));
  RECFLEET_RETURN_IF_ERROR(CheckComputeDType(x, "x"));
  if (q.device == Device::kCpu) return DequantizeCpu(q, scales, block, x);
  return DequantizeCuda(q, scales, block, x, stream);
}

absl::Status RandomHadamard(const TensorView& x, int64_t block, uint64_t seed, bool inverse,
                            const TensorView& y, void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckComputeDType(x, "x"));
  RECFLEET_RETURN_IF_ERROR(CheckSameShape(y, "y", x, "x"));
  RECFLEET_RETURN_IF_ERROR(CheckDType(y, "y", {x.dtype}));
  if (block < 2 || block > 4096 || (block & (block - 1)) != 0 || x.rank() < 1 ||
      x.dim(-1) % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Hadamard block must be a power of two in [2, 4096] dividing the last dimension of ",
        x.DebugString(), ", got ", block));
  }
  if (x.device == Device::kCpu) return HadamardCpu(x, block, seed, inverse, y);
  return HadamardCuda(x, block, seed, inverse, y, stream);
}

size_t PackedBytes(int64_t rows, int64_t cols, ScaleBlock block) {
  return PackedScalesOffset(rows, cols) + (PackedScalesBytes(rows, cols, block) + 15) / 16 * 16;
}

absl::Status PackQuantized(const TensorView& q, const TensorView& scales, ScaleBlock block,
                           void* buffer, void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckFp8(q, "q", q));
  RECFLEET_RETURN_IF_ERROR(CheckScales(scales, q, block));
  RECFLEET_RETURN_IF_ERROR(CheckBuffer(buffer, q.device));
  if (q.device == Device::kCpu) return PackCpu(q, scales, block, buffer);
  return PackCuda(q, scales, block, buffer, stream);
}

absl::Status QuantizeAndPack(const TensorView& x, const QuantizeConfig& config, void* buffer,
                             void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckMatrix(x, "x"));
  RECFLEET_RETURN_IF_ERROR(CheckBuffer(buffer, x.device));
  // Payload and scales are written straight to their packed positions; for
  // 32x32 blocks the kernel emits the E8M0 bytes itself.
  const int64_t rows = x.dim(0), cols = x.dim(1);
  char* base = static_cast<char*>(buffer);
  TensorView q = MakeView(base, config.format, {rows, cols}, x.device);
  TensorView scales = MakeView(base + PackedScalesOffset(rows, cols), DType::kFloat32,
                               QuantScaleShape(rows, cols, config.block), x.device);
  if (config.block != ScaleBlock::k32x32) return Quantize(x, config, false, q, scales, stream);
  RECFLEET_RETURN_IF_ERROR(CheckComputeDType(x, "x"));
  uint8_t* e8m0 = reinterpret_cast<uint8_t*>(scales.data);
  scales.data = nullptr;
  if (x.device == Device::kCpu) return QuantizeCpu(x, config, false, q, scales, e8m0);
  return QuantizeCuda(x, config, false, q, scales, e8m0, stream);
}

absl::Status UnpackQuantized(const void* buffer, ScaleBlock block, const TensorView& q,
                             const TensorView& scales, void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckFp8(q, "q", q));
  RECFLEET_RETURN_IF_ERROR(CheckScales(scales, q, block));
  RECFLEET_RETURN_IF_ERROR(CheckBuffer(buffer, q.device));
  if (q.device == Device::kCpu) return UnpackCpu(buffer, block, q, scales);
  return UnpackCuda(buffer, block, q, scales, stream);
}

}  // namespace recfleet

namespace recfleet {
namespace {

// A view of `numel` elements (any rank) on `device` of one of `dtypes`.
absl::Status CheckFlat(const TensorView& t, absl::string_view what, Device device, int64_t numel,
                       std::initializer_list<DType> dtypes) {
  RECFLEET_RETURN_IF_ERROR(CheckDevice(t, what, device));
  RECFLEET_RETURN_IF_ERROR(CheckDType(t, what, dtypes));
  if (t.numel() != numel || (numel > 0 && t.data == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must hold ", numel, " elements, got ", t.DebugString()));
  }
  return absl::OkStatus();
}

// The piece and a tile array (amax or scales) it indexes.
absl::Status CheckPiece(const TiledPiece& p, const TensorView& tiles, absl::string_view what, Device device) {
  if (p.numel < 0 || p.start < 0 || p.cols < 1 || p.first_tile < 0) {
    return absl::InvalidArgumentError(absl::StrCat("tiled piece needs numel, start, first_tile >= 0 and cols >= 1, got ",
                                                   p.numel, ", ", p.start, ", ", p.first_tile, ", ", p.cols));
  }
  RECFLEET_RETURN_IF_ERROR(CheckDevice(tiles, what, device));
  RECFLEET_RETURN_IF_ERROR(CheckDType(tiles, what, {DType::kFloat32}));
  if (p.numel == 0) return absl::OkStatus();
  // The piece's last element lies in the last tile it touches at most.
  const int64_t last = p.start + p.numel - 1, row = last / p.cols;
  const int64_t tiles_needed = p.first_tile + (row / 128 + 1) * ((p.cols + 127) / 128);
  if (tiles.numel() < tiles_needed) {
    return absl::InvalidArgumentError(absl::StrCat(what, " holds ", tiles.numel(), " tiles; the piece of ", p.numel,
                                                   " elements from ", p.start, " of a matrix of ", p.cols,
                                                   " columns reaches tile ", tiles_needed - 1));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t TileCount(int64_t rows, int64_t cols) {
  const Shape s = QuantScaleShape(rows, cols, ScaleBlock::k128x128);
  return s[0] * s[1];
}

absl::Status TiledPieceAmax(const TensorView& x, const TiledPiece& piece, const TensorView& amax, void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckFlat(x, "x", x.device, piece.numel, {DType::kFloat32}));
  RECFLEET_RETURN_IF_ERROR(CheckPiece(piece, amax, "amax", x.device));
  if (piece.numel == 0) return absl::OkStatus();
  if (x.device == Device::kCpu) return quant_internal::TiledPieceAmaxCpu(x.as<float>(), piece, amax.as<float>());
  return quant_internal::TiledPieceAmaxCuda(x.as<float>(), piece, amax.as<float>(), stream);
}

absl::Status TileScalesFromAmax(const TensorView& amax, DType format, const TensorView& scales, void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckDType(amax, "amax", {DType::kFloat32}));
  RECFLEET_RETURN_IF_ERROR(CheckFlat(scales, "scales", amax.device, amax.numel(), {DType::kFloat32}));
  if (format != DType::kFloat8E4M3 && format != DType::kFloat8E5M2) {
    return absl::InvalidArgumentError(absl::StrCat("format must be an FP8 dtype, got ", DTypeName(format)));
  }
  if (amax.numel() == 0) return absl::OkStatus();
  if (amax.device == Device::kCpu) {
    return quant_internal::TileScalesCpu(amax.as<float>(), amax.numel(), format, scales.as<float>());
  }
  return quant_internal::TileScalesCuda(amax.as<float>(), amax.numel(), format, scales.as<float>(), stream);
}

absl::Status QuantizeTiledPiece(const TensorView& x, const TiledPiece& piece, const TensorView& scales,
                                const TensorView& q, void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckFlat(x, "x", x.device, piece.numel, {DType::kFloat32}));
  RECFLEET_RETURN_IF_ERROR(CheckFlat(q, "q", x.device, piece.numel, {DType::kFloat8E4M3, DType::kFloat8E5M2}));
  RECFLEET_RETURN_IF_ERROR(CheckPiece(piece, scales, "scales", x.device));
  if (piece.numel == 0) return absl::OkStatus();
  if (x.device == Device::kCpu) {
    return quant_internal::QuantizeTiledPieceCpu(x.as<float>(), piece, scales.as<float>(), q.dtype, q.as<uint8_t>());
  }
  return quant_internal::QuantizeTiledPieceCuda(x.as<float>(), piece, scales.as<float>(), q.dtype, q.as<uint8_t>(),
                                                stream);
}

absl::Status DequantizeTiledPiece(const TensorView& q, const TiledPiece& piece, const TensorView& scales,
                                  const TensorView& x, void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckFlat(q, "q", q.device, piece.numel, {DType::kFloat8E4M3, DType::kFloat8E5M2}));
  RECFLEET_RETURN_IF_ERROR(CheckFlat(x, "x", q.device, piece.numel, {DType::kFloat32}));
  RECFLEET_RETURN_IF_ERROR(CheckPiece(piece, scales, "scales", q.device));
  if (piece.numel == 0) return absl::OkStatus();
  if (q.device == Device::kCpu) {
    return quant_internal::DequantizeTiledPieceCpu(q.as<uint8_t>(), piece, scales.as<float>(), q.dtype,
                                                   x.as<float>());
  }
  return quant_internal::DequantizeTiledPieceCuda(q.as<uint8_t>(), piece, scales.as<float>(), q.dtype, x.as<float>(),
                                                  stream);
}

}  // namespace recfleet
