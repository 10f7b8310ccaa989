// CPU reference for quantize.h. Element arithmetic goes through
// minifloat.h, the same code the CUDA kernels run, so results match bit for
// bit; the loops are plain and unoptimized.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/base/formats.h"
#include "kernels/base/minifloat.h"
#include "kernels/quant/quantize_internal.h"

namespace recfleet::quant_internal {
namespace {

minifloat::Spec SpecOf(DType format) {
  return format == DType::kFloat8E5M2 ? minifloat::E5M2() : minifloat::E4M3();
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

absl::Status QuantizeCpu(const TensorView& x, const QuantizeConfig& config, bool transpose,
                         const TensorView& q, const TensorView& scales, uint8_t* e8m0) {
  const int64_t rows = q.dim(0), cols = q.dim(1);
  const int64_t x_cols = x.dim(1);
  const BlockDims b = DimsOf(config.block);
  const minifloat::Spec spec = SpecOf(config.format);
  const float fmax = Fp8Max(config.format);
  const bool pow2 = config.block == ScaleBlock::k32x32;
  const uint32_t key = minifloat::RandomKey(config.seed);
  auto load = [&](int64_t i, int64_t j) {
    return static_cast<float>(LoadAsDouble(x, transpose ? j * x_cols + i : i * x_cols + j));
  };
  const int64_t scale_cols = CeilDiv(cols, b.cols);
  for (int64_t bi = 0; bi * b.rows < rows; ++bi) {
    for (int64_t bj = 0; bj * b.cols < cols; ++bj) {
      const int64_t i1 = std::min(rows, (bi + 1) * b.rows), j1 = std::min(cols, (bj + 1) * b.cols);
      float amax = 0;
      for (int64_t i = bi * b.rows; i < i1; ++i) {
        for (int64_t j = bj * b.cols; j < j1; ++j) amax = std::max(amax, std::fabs(load(i, j)));
      }
      const float s = minifloat::BlockScale(amax, fmax, pow2);
      if (e8m0 != nullptr) {
        e8m0[bi * scale_cols + bj] = ToE8M0(s);
      } else {
        scales.as<float>()[bi * scale_cols + bj] = s;
      }
      const float inv = minifloat::Reciprocal(s);
      for (int64_t i = bi * b.rows; i < i1; ++i) {
        for (int64_t j = bj * b.cols; j < j1; ++j) {
          const float v = load(i, j) * inv;
          const int64_t k = i * cols + j;
          q.as<uint8_t>()[k] =
              config.rounding == Rounding::kStochastic
                  ? minifloat::EncodeStochastic(
                        spec, v, minifloat::RandomBits(key, static_cast<uint64_t>(k)))
                  : minifloat::Encode(spec, v);
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status DequantizeCpu(const TensorView& q, const TensorView& scales, ScaleBlock block,
                           const TensorView& x) {
  const int64_t rows = q.dim(0), cols = q.dim(1);
  const BlockDims b = DimsOf(block);
  const int64_t scale_cols = CeilDiv(cols, b.cols);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const double s = scales.as<const float>()[(i / b.rows) * scale_cols + j / b.cols];
      StoreFromDouble(x, i * cols + j, LoadAsDouble(q, i * cols + j) * s);
    }
  }
  return absl::OkStatus();
}

absl::Status HadamardCpu(const TensorView& x, int64_t block, uint64_t seed, bool inverse,
                         const TensorView& y) {
  const int64_t cols = x.dim(-1), rows = x.numel() / cols;
  const double norm = 1.0 / std::sqrt(static_cast<double>(block));
  std::vector<double> seg(block);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c0 = 0; c0 < cols; c0 += block) {
      for (int64_t j = 0; j < block; ++j) {
        const double v = LoadAsDouble(x, r * cols + c0 + j);
        seg[j] = inverse ? v : v * minifloat::RandomSign(seed, c0 + j);
      }
      // In-place fast Walsh-Hadamard transform (Sylvester order).
      for (int64_t h = 1; h < block; h *= 2) {
        for (int64_t i = 0; i < block; i += 2 * h) {
          for (int64_t j = i; j < i + h; ++j) {
            const double a = seg[j], b = seg[j + h];
            seg[j] = a + b;
            seg[j + h] = a - b;
          }
        }
      }
      for (int64_t j = 0; j < block; ++j) {
        const double v = seg[j] * norm;
        StoreFromDouble(y, r * cols + c0 + j, inverse ? v * minifloat::RandomSign(seed, c0 + j) : v);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status PackCpu(const TensorView& q, const TensorView& scales, ScaleBlock block,
                     void* buffer) {
  const int64_t rows = q.dim(0), cols = q.dim(1);
  char* out = static_cast<char*>(buffer);
  std::memcpy(out, q.data, q.nbytes());
  char* dst = out + PackedScalesOffset(rows, cols);
  if (block != ScaleBlock::k32x32) {
    std::memcpy(dst, scales.data, scales.nbytes());
    return absl::OkStatus();
  }
  for (int64_t i = 0; i < scales.numel(); ++i) {
    dst[i] = static_cast<char>(ToE8M0(scales.as<const float>()[i]));
  }
  return absl::OkStatus();
}

absl::Status UnpackCpu(const void* buffer, ScaleBlock block, const TensorView& q,
                       const TensorView& scales) {
  const int64_t rows = q.dim(0), cols = q.dim(1);
  const char* in = static_cast<const char*>(buffer);
  std::memcpy(q.data, in, q.nbytes());
  const char* src = in + PackedScalesOffset(rows, cols);
  if (block != ScaleBlock::k32x32) {
    std::memcpy(scales.data, src, scales.nbytes());
    return absl::OkStatus();
  }
  for (int64_t i = 0; i < scales.numel(); ++i) {
    scales.as<float>()[i] = FromE8M0(static_cast<uint8_t>(src[i]));
  }
  return absl::OkStatus();
}

namespace {

// Calls f(i, tile) for each element i of the piece, with the index of its
// 128x128 tile in the scale array.
template <typename F>
void ForEachTiled(const TiledPiece& p, F f) {
  const int64_t tiles_per_row = (p.cols + 127) / 128;
  int64_t row = p.start / p.cols, col = p.start % p.cols;
  for (int64_t i = 0; i < p.numel; ++i) {
    f(i, p.first_tile + (row / 128) * tiles_per_row + col / 128);
    if (++col == p.cols) col = 0, ++row;
  }
}

}  // namespace

absl::Status TiledPieceAmaxCpu(const float* x, const TiledPiece& piece, float* amax) {
  ForEachTiled(piece, [&](int64_t i, int64_t tile) {
    const float a = std::fabs(x[i]);
    if (a > amax[tile]) amax[tile] = a;  // NaN is never greater
  });
  return absl::OkStatus();
}

absl::Status TileScalesCpu(const float* amax, int64_t n, DType format, float* scales) {
  const float fmax = Fp8Max(format);
  for (int64_t i = 0; i < n; ++i) scales[i] = minifloat::BlockScale(amax[i], fmax, false);
  return absl::OkStatus();
}

absl::Status QuantizeTiledPieceCpu(const float* x, const TiledPiece& piece, const float* scales,
                                   DType format, uint8_t* q) {
  const minifloat::Spec spec = SpecOf(format);
  ForEachTiled(piece, [&](int64_t i, int64_t tile) {
    q[i] = minifloat::Encode(spec, x[i] * minifloat::Reciprocal(scales[tile]));
  });
  return absl::OkStatus();
}

absl::Status DequantizeTiledPieceCpu(const uint8_t* q, const TiledPiece& piece, const float* scales,
                                     DType format, float* x) {
  const minifloat::Spec spec = SpecOf(format);
  ForEachTiled(piece, [&](int64_t i, int64_t tile) { x[i] = minifloat::Decode(spec, q[i]) * scales[tile]; });
  return absl::OkStatus();
}

}  // namespace recfleet::quant_internal
