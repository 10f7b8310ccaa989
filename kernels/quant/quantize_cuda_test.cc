// CUDA quantization kernels against the CPU reference on fresh random data.
// Both run the same element code (minifloat.h), so FP8 bytes and scales
// must match bit for bit.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/device_buffer.h"
#include "kernels/base/formats.h"
#include "kernels/base/minifloat.h"
#include "kernels/base/test_random.h"
#include "kernels/quant/quantize.h"
#include "kernels/quant/quantize_kernels.h"
#include "kernels/quant/tiled_testing.h"

namespace recfleet {
namespace {

std::vector<uint8_t> RandomMatrix(DType dtype, int64_t n) {
  std::vector<double> v = RandomDoubles(n, -1, 1), e = RandomDoubles(n, -8, 8);
  std::vector<uint8_t> out(n * DTypeSize(dtype));
  TensorView t = MakeView(out.data(), dtype, {n});
  for (int64_t i = 0; i < n; ++i) StoreFromDouble(t, i, v[i] * std::exp2(e[i]));
  return out;
}

// Values the kernels' fast paths must not take: a NaN and infinities in the
// first tile, and rows 128..255 of the first 128 columns scaled down to
// ~1e-40 (subnormal in fp32 and bf16), so that their blocks' scales
// underflow and their reciprocals are infinite. Encoded as the CPU does:
// the kernels skip their per-row NaN/infinity checks only for tiles and
// scales they saw are finite.
void InjectSpecials(DType dtype, int64_t rows, int64_t cols, std::vector<uint8_t>& x) {
  TensorView t = MakeView(x.data(), dtype, {rows * cols});
  auto put = [&](int64_t r, int64_t c, double v) {
    if (r < rows && c < cols) StoreFromDouble(t, r * cols + c, v);
  };
  put(1, 2, std::numeric_limits<double>::quiet_NaN());
  put(5, 7, std::numeric_limits<double>::infinity());
  put(70, 100, -std::numeric_limits<double>::infinity());
  for (int64_t r = 128; r < std::min<int64_t>(rows, 256); ++r) {
    for (int64_t c = 0; c < std::min<int64_t>(cols, 128); ++c) {
      put(r, c, LoadAsDouble(t, r * cols + c) * 1e-40);
    }
  }
  // Rows of exact zeros and one value near 1e-37 from column 128 on (a
  // nearly unused expert's gradients): amax / fmax is subnormal, and a zero
  // times an overflowed reciprocal would encode NaN.
  for (int64_t r = 128; r < std::min<int64_t>(rows, 160); ++r) {
    for (int64_t c = 128; c < std::min<int64_t>(cols, 384); ++c) put(r, c, c == 128 + r % 64 ? 1e-37 : 0.0);
  }
}

// Equal element by element, a NaN matching a NaN (whatever its payload).
void ExpectSameValues(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    bad += !(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])));
  }
  EXPECT_EQ(bad, 0);
}

void CheckQuantize(DType in, int64_t rows, int64_t cols, const QuantizeConfig& cfg,
                   bool transpose, bool specials = false) {
  SCOPED_TRACE(::testing::Message() << DTypeName(in) << " [" << rows << ", " << cols << "] "
                                    << ScaleBlockName(cfg.block) << " " << DTypeName(cfg.format)
                                    << (transpose ? " transposed" : "")
                                    << (cfg.rounding == Rounding::kStochastic ? " stochastic" : "")
                                    << (specials ? " specials" : ""));
  std::vector<uint8_t> x = RandomMatrix(in, rows * cols);
  if (specials) InjectSpecials(in, rows, cols, x);
  const int64_t qr = transpose ? cols : rows, qc = transpose ? rows : cols;
  const Shape ss = QuantScaleShape(qr, qc, cfg.block);
  std::vector<uint8_t> q(qr * qc);
  std::vector<float> scales(ss[0] * ss[1]);
  ASSERT_TRUE(Quantize(MakeView(x.data(), in, {rows, cols}), cfg, transpose,
                       MakeView(q.data(), cfg.format, {qr, qc}),
                       MakeView(scales.data(), DType::kFloat32, ss))
                  .ok());
  DeviceBuffer dx(x), dq(q.size()), ds(scales.size() * 4);
  CudaOrDie(cudaMemset(dq.get(), 0x7F, dq.bytes()), "poison");
  absl::Status s = Quantize(dx.View(in, {rows, cols}), cfg, transpose, dq.View(cfg.format, {qr, qc}),
                            ds.View(DType::kFloat32, ss));
  ASSERT_TRUE(s.ok()) << s;
  std::vector<uint8_t> q_gpu = dq.ToHost<uint8_t>();
  std::vector<float> s_gpu = ds.ToHost<float>();
  ASSERT_EQ(s_gpu, scales);
  int64_t bad = 0;
  for (size_t i = 0; i < q.size(); ++i) bad += q_gpu[i] != q[i];
  ASSERT_EQ(bad, 0) << "first mismatch at "
                    << std::distance(q.begin(), std::mismatch(q.begin(), q.end(), q_gpu.begin()).first);

  // Dequantize on the device agrees with the host.
  std::vector<float> back(qr * qc);
  ASSERT_TRUE(Dequantize(MakeView(q.data(), cfg.format, {qr, qc}),
                         MakeView(scales.data(), DType::kFloat32, ss), cfg.block,
                         MakeView(back.data(), DType::kFloat32, {qr, qc}))
                  .ok());
  DeviceBuffer dback(back.size() * 4);
  ASSERT_TRUE(Dequantize(dq.View(cfg.format, {qr, qc}), ds.View(DType::kFloat32, ss), cfg.block,
                         dback.View(DType::kFloat32, {qr, qc}))
                  .ok());
  ExpectSameValues(dback.ToHost<float>(), back);

  // And into bf16: the same fp32 product rounded to nearest even, by the
  // 16-element path (aligned output, whole 16-column groups) and the
  // element path (the output one element off 16-byte alignment).
  std::vector<uint16_t> want16(back.size());
  for (size_t i = 0; i < back.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &back[i], 4);
    want16[i] = std::isnan(back[i]) ? 0x7FC0
                                    : static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  }
  for (int64_t shift : {0, 1}) {
    SCOPED_TRACE(shift == 0 ? "bf16 aligned" : "bf16 misaligned");
    DeviceBuffer d16((back.size() + 1) * 2);
    CudaOrDie(cudaMemset(d16.get(), 0xFF, d16.bytes()), "poison");
    const TensorView out16 = MakeView(static_cast<uint16_t*>(d16.get()) + shift, DType::kBFloat16,
                                      {qr, qc}, Device::kCuda);
    ASSERT_TRUE(Dequantize(dq.View(cfg.format, {qr, qc}), ds.View(DType::kFloat32, ss), cfg.block,
                           out16)
                    .ok());
    const std::vector<uint16_t> got = d16.ToHost<uint16_t>();
    int64_t bad16 = 0;
    for (size_t i = 0; i < want16.size(); ++i) {
      const uint16_t g = got[i + shift];
      const bool g_nan = (g & 0x7F80) == 0x7F80 && (g & 0x7F) != 0;
      bad16 += !(g == want16[i] || (g_nan && std::isnan(back[i])));
    }
    EXPECT_EQ(bad16, 0);
  }
}

// bf16 first in each test: a kernel's shared-memory opt-in persists in the
// process, so an fp32 launch (larger stage) first could hide a missing
// opt-in of the bf16 one.
TEST(QuantizeCudaTest, BitExactWithCpuReference) {
  for (DType in : {DType::kBFloat16, DType::kFloat32}) {
    for (ScaleBlock block : {ScaleBlock::k1x128, ScaleBlock::k128x128, ScaleBlock::k32x32}) {
      for (bool t : {false, true}) {
        QuantizeConfig cfg{block, DType::kFloat8E4M3, Rounding::kNearest, 0};
        CheckQuantize(in, 256, 384, cfg, t);  // whole tiles
        CheckQuantize(in, 131, 259, cfg, t);  // partial tiles, unaligned rows
        cfg.rounding = Rounding::kStochastic;
        cfg.seed = TestRng()();
        CheckQuantize(in, 130, 200, cfg, t);
        cfg.format = DType::kFloat8E5M2;
        CheckQuantize(in, 64, 129, cfg, t);
        // Whole 128-column rows (1x128 of x takes the row kernel), with a
        // partial last block of threads and a half-used warp.
        CheckQuantize(in, 33, 384, cfg, t);
        cfg.format = DType::kFloat8E4M3;
        CheckQuantize(in, 96, 256, cfg, t);
        cfg.rounding = Rounding::kNearest;
        CheckQuantize(in, 33, 128, cfg, t);
        CheckQuantize(in, 3, 128, cfg, t);  // fewer slots than one block's threads
      }
    }
  }
}

// Host result of one quantization: FP8 bytes and fp32 scales (row-major).
struct HostQuant {
  std::vector<uint8_t> q;
  std::vector<float> scales;
};

HostQuant CpuQuantize(const TensorView& x, const QuantizeConfig& cfg, bool transpose) {
  const int64_t qr = transpose ? x.dim(1) : x.dim(0), qc = transpose ? x.dim(0) : x.dim(1);
  const Shape ss = QuantScaleShape(qr, qc, cfg.block);
  HostQuant h{std::vector<uint8_t>(qr * qc), std::vector<float>(ss[0] * ss[1])};
  EXPECT_TRUE(Quantize(x, cfg, transpose, MakeView(h.q.data(), cfg.format, {qr, qc}),
                       MakeView(h.scales.data(), DType::kFloat32, ss))
                  .ok());
  return h;
}

// Device buffers for one output of quant_cuda::Quantize, scales row-major.
struct DeviceQuant {
  DeviceQuant(int64_t qr, int64_t qc, ScaleBlock block, const QuantizeConfig& cfg)
      : shape(QuantScaleShape(qr, qc, block)), q(qr * qc), scales(shape[0] * shape[1] * 4) {
    CudaOrDie(cudaMemset(q.get(), 0x7F, q.bytes()), "poison");
    target.q = static_cast<uint8_t*>(q.get());
    target.scales = static_cast<float*>(scales.get());
    target.scale_stride_row = shape[1];
    target.stochastic = cfg.rounding == Rounding::kStochastic;
    target.seed = cfg.seed;
  }
  Shape shape;
  DeviceBuffer q, scales;
  quant_cuda::QuantizeTarget target;
};

// One pass of quant_cuda::Quantize over fresh random x [rows, cols] writing
// quantize(x) with `cfg` and quantize(x^T) with `cfg_t` gives the CPU bytes
// and scales of the two single passes.
void CheckOnePass(DType in, int64_t rows, int64_t cols, const QuantizeConfig& cfg,
                  const QuantizeConfig& cfg_t, bool specials = false) {
  SCOPED_TRACE(::testing::Message() << DTypeName(in) << " " << ScaleBlockName(cfg.block) << " ["
                                    << rows << ", " << cols << "]"
                                    << (cfg_t.rounding == Rounding::kStochastic ? " stochastic x^T"
                                                                                : "")
                                    << (specials ? " specials" : ""));
  const ScaleBlock block = cfg.block;
  std::vector<uint8_t> x = RandomMatrix(in, rows * cols);
  if (specials) InjectSpecials(in, rows, cols, x);
  const HostQuant want = CpuQuantize(MakeView(x.data(), in, {rows, cols}), cfg, false);
  const HostQuant want_t = CpuQuantize(MakeView(x.data(), in, {rows, cols}), cfg_t, true);
  DeviceBuffer dx(x);
  DeviceQuant d(rows, cols, block, cfg), dt(cols, rows, block, cfg_t);
  quant_cuda::QuantizeArgs a;
  a.x = dx.get();
  a.x_type = in == DType::kBFloat16 ? 1 : 0;
  a.rows = rows;
  a.cols = cols;
  a.block_rows = block == ScaleBlock::k1x128 ? 1 : (block == ScaleBlock::k32x32 ? 32 : 128);
  a.block_cols = block == ScaleBlock::k32x32 ? 32 : 128;
  a.pow2 = block == ScaleBlock::k32x32;
  a.direct = d.target;
  a.transposed = dt.target;
  ASSERT_EQ(quant_cuda::Quantize(a, nullptr), cudaSuccess);
  EXPECT_EQ(d.q.ToHost<uint8_t>(), want.q);
  EXPECT_EQ(d.scales.ToHost<float>(), want.scales);
  EXPECT_EQ(dt.q.ToHost<uint8_t>(), want_t.q);
  EXPECT_EQ(dt.scales.ToHost<float>(), want_t.scales);
}

// Both orientations from one read (the transposed one also stochastically
// rounded, so the square blocks' shared encoding is not taken for it).
TEST(QuantizeCudaTest, OnePassWritesBothOrientations) {
  for (DType in : {DType::kBFloat16, DType::kFloat32}) {
    for (ScaleBlock block : {ScaleBlock::k1x128, ScaleBlock::k128x128, ScaleBlock::k32x32}) {
      for (bool stochastic : {false, true}) {
        for (auto [rows, cols] : {std::pair<int64_t, int64_t>{256, 384}, {131, 260}}) {
          const QuantizeConfig cfg{block, DType::kFloat8E4M3, Rounding::kNearest, 0};
          QuantizeConfig cfg_t = cfg;
          if (stochastic) {
            cfg_t.rounding = Rounding::kStochastic;
            cfg_t.seed = TestRng()();
          }
          CheckOnePass(in, rows, cols, cfg, cfg_t);
        }
      }
    }
  }
}

// NaN, infinities and blocks whose scale underflows (InjectSpecials) give the
// CPU's bytes in every kernel: row and tile kernels, one and both
// orientations, nearest and stochastic rounding.
TEST(QuantizeCudaTest, NonFiniteValuesAndUnderflowingScalesMatchCpu) {
  for (DType in : {DType::kBFloat16, DType::kFloat32}) {
    for (ScaleBlock block : {ScaleBlock::k1x128, ScaleBlock::k128x128, ScaleBlock::k32x32}) {
      for (bool stochastic : {false, true}) {
        QuantizeConfig cfg{block, DType::kFloat8E4M3, Rounding::kNearest, 0};
        if (stochastic) {
          cfg.rounding = Rounding::kStochastic;
          cfg.seed = TestRng()();
        }
        for (bool t : {false, true}) CheckQuantize(in, 256, 384, cfg, t, /*specials=*/true);
        QuantizeConfig cfg_d = cfg;
        cfg_d.rounding = Rounding::kNearest;
        CheckOnePass(in, 256, 384, cfg_d, cfg, /*specials=*/true);
      }
    }
  }
}

// Enough tiles that every persistent block of the tile kernel handles
// several, so the copies of the next tiles overlap the current one and the
// ring of stages wraps around (and the square blocks' shared encoding moves
// on to the next tile correctly); with stochastic rounding of x^T too.
TEST(QuantizeCudaTest, ManyTilesPerBlockMatchCpu) {
  for (DType in : {DType::kBFloat16, DType::kFloat32}) {
    for (ScaleBlock block : {ScaleBlock::k1x128, ScaleBlock::k128x128, ScaleBlock::k32x32}) {
      const QuantizeConfig cfg{block, DType::kFloat8E4M3, Rounding::kNearest, 0};
      CheckOnePass(in, 2560, 3584, cfg, cfg);  // 560 tiles
      CheckQuantize(in, 2560, 3584, cfg, /*transpose=*/true);
    }
    const QuantizeConfig cfg{ScaleBlock::k1x128, DType::kFloat8E4M3, Rounding::kNearest, 0};
    QuantizeConfig cfg_t = cfg;
    cfg_t.rounding = Rounding::kStochastic;
    cfg_t.seed = TestRng()();
    CheckOnePass(in, 2560, 3584, cfg, cfg_t);
    CheckQuantize(in, 2560, 3584, cfg_t, /*transpose=*/true);
  }
}

// The transposed output with the fused 128-point Hadamard transform along
// x's rows equals quantizing the transformed x^T (the CPU transforms in
// double, the kernel in fp32, so a few bytes may sit on the other side of a
// rounding boundary).
TEST(QuantizeCudaTest, FusedHadamardMatchesTransformThenQuantize) {
  const int64_t rows = 256, cols = 200;
  std::vector<uint8_t> x = RandomMatrix(DType::kBFloat16, rows * cols);
  const TensorView xv = MakeView(x.data(), DType::kBFloat16, {rows, cols});
  std::vector<double> xt(cols * rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) xt[c * rows + r] = LoadAsDouble(xv, r * cols + c);
  }
  const uint64_t seed = TestRng()();
  const TensorView xtv = MakeView(xt.data(), DType::kFloat64, {cols, rows});
  ASSERT_TRUE(RandomHadamard(xtv, 128, seed, false, xtv).ok());
  const QuantizeConfig cfg{ScaleBlock::k1x128, DType::kFloat8E4M3, Rounding::kNearest, 0};
  const HostQuant want = CpuQuantize(xtv, cfg, false);
  DeviceBuffer dx(x);
  DeviceQuant dt(cols, rows, ScaleBlock::k1x128, cfg);
  quant_cuda::QuantizeArgs a;
  a.x = dx.get();
  a.x_type = 1;
  a.rows = rows;
  a.cols = cols;
  a.transposed = dt.target;
  a.hadamard_transposed = true;
  a.hadamard_seed = seed;
  ASSERT_EQ(quant_cuda::Quantize(a, nullptr), cudaSuccess);
  const std::vector<uint8_t> got = dt.q.ToHost<uint8_t>();
  const std::vector<float> got_s = dt.scales.ToHost<float>();
  int64_t same = 0;
  for (size_t i = 0; i < got.size(); ++i) same += got[i] == want.q[i];
  EXPECT_GE(same, static_cast<int64_t>(got.size() * 0.99));
  for (size_t i = 0; i < got_s.size(); ++i) EXPECT_NEAR(got_s[i], want.scales[i], 1e-5 * want.scales[i]);
  // Dequantized, the output is the transform to FP8 accuracy.
  double num = 0, den = 0;
  for (int64_t i = 0; i < cols * rows; ++i) {
    const double v = minifloat::Decode(minifloat::E4M3(), got[i]) * got_s[i / 128];
    num += (v - xt[i]) * (v - xt[i]);
    den += xt[i] * xt[i];
  }
  EXPECT_LT(std::sqrt(num / den), 0.05);
}

TEST(QuantizeCudaTest, HadamardMatchesCpuAndInverts) {
  const int64_t rows = 37, cols = 512;
  std::vector<double> xd = RandomDoubles(rows * cols);
  std::vector<float> x(xd.begin(), xd.end()), y(rows * cols), back(rows * cols);
  const uint64_t seed = TestRng()();
  for (int64_t block : {2, 64, 512}) {
    ASSERT_TRUE(RandomHadamard(MakeView(x.data(), DType::kFloat32, {rows, cols}), block, seed,
                               false, MakeView(y.data(), DType::kFloat32, {rows, cols}))
                    .ok());
    DeviceBuffer dx(x), dy(y.size() * 4), db(y.size() * 4);
    ASSERT_TRUE(RandomHadamard(dx.View(DType::kFloat32, {rows, cols}), block, seed, false,
                               dy.View(DType::kFloat32, {rows, cols}))
                    .ok());
    ASSERT_TRUE(RandomHadamard(dy.View(DType::kFloat32, {rows, cols}), block, seed, true,
                               db.View(DType::kFloat32, {rows, cols}))
                    .ok());
    std::vector<float> y_gpu = dy.ToHost<float>(), b_gpu = db.ToHost<float>();
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_NEAR(y_gpu[i], y[i], 1e-5) << "block " << block << " at " << i;
      ASSERT_NEAR(b_gpu[i], x[i], 1e-5) << "block " << block << " at " << i;
    }
  }
}

TEST(QuantizeCudaTest, PackedBuffersMatchTheCpuBytes) {
  const int64_t rows = 96, cols = 160;
  for (ScaleBlock block : {ScaleBlock::k1x128, ScaleBlock::k128x128, ScaleBlock::k32x32}) {
    std::vector<uint8_t> x = RandomMatrix(DType::kBFloat16, rows * cols);
    QuantizeConfig cfg{block, DType::kFloat8E4M3, Rounding::kNearest, 0};
    const size_t bytes = PackedBytes(rows, cols, block);
    std::vector<uint8_t> host(bytes + 16);
    uint8_t* aligned = host.data() + (16 - reinterpret_cast<uintptr_t>(host.data()) % 16) % 16;
    ASSERT_TRUE(QuantizeAndPack(MakeView(x.data(), DType::kBFloat16, {rows, cols}), cfg, aligned).ok());
    DeviceBuffer dx(x), packed(bytes), q(rows * cols);
    const Shape ss = QuantScaleShape(rows, cols, block);
    DeviceBuffer sc(ss[0] * ss[1] * 4), packed2(bytes);
    // Padding between the parts is unspecified; zero it on both sides.
    CudaOrDie(cudaMemset(packed.get(), 0, bytes), "zero");
    CudaOrDie(cudaMemset(packed2.get(), 0, bytes), "zero");
    ASSERT_TRUE(QuantizeAndPack(dx.View(DType::kBFloat16, {rows, cols}), cfg, packed.get()).ok());
    std::vector<uint8_t> got = packed.ToHost<uint8_t>();
    EXPECT_EQ(std::memcmp(got.data(), aligned, bytes), 0) << ScaleBlockName(block);
    // Unpack, re-pack on the device: identical bytes.
    ASSERT_TRUE(UnpackQuantized(packed.get(), block, q.View(DType::kFloat8E4M3, {rows, cols}),
                                sc.View(DType::kFloat32, ss))
                    .ok());
    ASSERT_TRUE(PackQuantized(q.View(DType::kFloat8E4M3, {rows, cols}), sc.View(DType::kFloat32, ss),
                              block, packed2.get())
                    .ok());
    std::vector<uint8_t> again = packed2.ToHost<uint8_t>();
    EXPECT_EQ(got, again) << ScaleBlockName(block);
  }
}

// The tiled-piece calls (an FP8 all-gather's shards) on the device against
// the CPU: a large matrix and a narrow one in one flat buffer, cut into
// holders' ranges anywhere (mid-row, mid-tile, across the two matrices),
// two NaNs and a zero run; amax reduced over the holders on the host.
TEST(QuantizeCudaTest, TiledPiecesMatchTheCpuBits) {
  const TiledMatrices layout({{1000, 1100}, {300, 40}});
  const int64_t numel = layout.numel, tiles = layout.tiles;
  std::vector<uint8_t> bytes = RandomMatrix(DType::kFloat32, numel);
  std::vector<float> w(numel);
  std::memcpy(w.data(), bytes.data(), numel * sizeof(float));
  w[12345] = w[200'003] = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 500'000; i < 520'000; ++i) w[i] = 0.0f;
  // Holders' ranges starting at odd elements (the element-wise path) and at
  // multiples of 8 (aligned: the vector path, with runs that cross tile
  // borders and rows of 1,100 columns in between).
  const std::vector<int64_t> cuts = {0, 7, 140'800, 555'552, 1'099'999, 1'100'013, numel};
  DeviceBuffer dw(w), d_amax(tiles * 4), d_scales(tiles * 4), dq(numel), dback(numel * 4);
  CudaOrDie(cudaMemset(dq.get(), 0x7F, numel), "poison q");
  CudaOrDie(cudaMemset(dback.get(), 0xFF, numel * 4), "poison output");
  std::vector<float> amax(tiles, 0.0f);
  for (size_t h = 0; h + 1 < cuts.size(); ++h) {
    CudaOrDie(cudaMemset(d_amax.get(), 0, tiles * 4), "zero amax");
    std::vector<float> own(tiles, 0.0f);
    for (const auto& [at, p] : layout.PiecesOf(cuts[h], cuts[h + 1])) {
      ASSERT_TRUE(TiledPieceAmax(MakeView(static_cast<float*>(dw.get()) + at, DType::kFloat32, {p.numel}, Device::kCuda), p,
                                 d_amax.View(DType::kFloat32, {tiles}))
                      .ok());
      ASSERT_TRUE(TiledPieceAmax(MakeView(w.data() + at, DType::kFloat32, {p.numel}), p,
                                 MakeView(own.data(), DType::kFloat32, {tiles}))
                      .ok());
    }
    const std::vector<float> got = d_amax.ToHost<float>();
    ASSERT_EQ(got, own) << "holder " << h;
    for (int64_t i = 0; i < tiles; ++i) amax[i] = std::max(amax[i], got[i]);
  }
  CudaOrDie(cudaMemcpy(d_amax.get(), amax.data(), tiles * 4, cudaMemcpyHostToDevice), "amax up");
  ASSERT_TRUE(TileScalesFromAmax(d_amax.View(DType::kFloat32, {tiles}), DType::kFloat8E4M3,
                                 d_scales.View(DType::kFloat32, {tiles}))
                  .ok());
  std::vector<float> scales(tiles);
  ASSERT_TRUE(TileScalesFromAmax(MakeView(amax.data(), DType::kFloat32, {tiles}), DType::kFloat8E4M3,
                                 MakeView(scales.data(), DType::kFloat32, {tiles}))
                  .ok());
  ASSERT_EQ(d_scales.ToHost<float>(), scales);
  std::vector<uint8_t> q(numel);
  std::vector<float> back(numel);
  for (size_t h = 0; h + 1 < cuts.size(); ++h) {
    for (const auto& [at, p] : layout.PiecesOf(cuts[h], cuts[h + 1])) {
      const TensorView dqv = MakeView(static_cast<uint8_t*>(dq.get()) + at, DType::kFloat8E4M3, {p.numel}, Device::kCuda);
      ASSERT_TRUE(QuantizeTiledPiece(MakeView(static_cast<float*>(dw.get()) + at, DType::kFloat32, {p.numel}, Device::kCuda), p,
                                     d_scales.View(DType::kFloat32, {tiles}), dqv)
                      .ok());
      ASSERT_TRUE(DequantizeTiledPiece(dqv, p, d_scales.View(DType::kFloat32, {tiles}),
                                       MakeView(static_cast<float*>(dback.get()) + at, DType::kFloat32, {p.numel}, Device::kCuda))
                      .ok());
      const TensorView sv = MakeView(scales.data(), DType::kFloat32, {tiles});
      const TensorView qv = MakeView(q.data() + at, DType::kFloat8E4M3, {p.numel});
      ASSERT_TRUE(QuantizeTiledPiece(MakeView(w.data() + at, DType::kFloat32, {p.numel}), p, sv, qv).ok());
      ASSERT_TRUE(DequantizeTiledPiece(qv, p, sv, MakeView(back.data() + at, DType::kFloat32, {p.numel})).ok());
    }
  }
  CudaOrDie(cudaDeviceSynchronize(), "tiled pieces");
  EXPECT_EQ(dq.ToHost<uint8_t>(), q);
  ExpectSameValues(dback.ToHost<float>(), back);
}

}  // namespace
}  // namespace recfleet
