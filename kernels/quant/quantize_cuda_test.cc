// CUDA quantization kernels against the CPU reference on fresh random data.
// Both run the same element code (minifloat.h), so FP8 bytes and scales
// must match bit for bit.

#include <cmath>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/quant/device_buffer.h"
#include "kernels/quant/formats.h"
#include "kernels/quant/quantize.h"
#include "kernels/quant/test_random.h"

namespace recfleet {
namespace {

std::vector<uint8_t> RandomMatrix(DType dtype, int64_t n) {
  std::vector<double> v = RandomDoubles(n, -1, 1), e = RandomDoubles(n, -8, 8);
  std::vector<uint8_t> out(n * DTypeSize(dtype));
  TensorView t = MakeView(out.data(), dtype, {n});
  for (int64_t i = 0; i < n; ++i) StoreFromDouble(t, i, v[i] * std::exp2(e[i]));
  return out;
}

void CheckQuantize(DType in, int64_t rows, int64_t cols, const QuantizeConfig& cfg,
                   bool transpose) {
  SCOPED_TRACE(::testing::Message() << DTypeName(in) << " [" << rows << ", " << cols << "] "
                                    << ScaleBlockName(cfg.block) << " " << DTypeName(cfg.format)
                                    << (transpose ? " transposed" : "")
                                    << (cfg.rounding == Rounding::kStochastic ? " stochastic" : ""));
  std::vector<uint8_t> x = RandomMatrix(in, rows * cols);
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
  EXPECT_EQ(dback.ToHost<float>(), back);
}

TEST(QuantizeCudaTest, BitExactWithCpuReference) {
  for (DType in : {DType::kFloat32, DType::kBFloat16}) {
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
      }
    }
  }
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

}  // namespace
}  // namespace recfleet
