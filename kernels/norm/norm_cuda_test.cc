// CUDA norms against the CPU reference on fresh random data.

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/device_buffer.h"
#include "kernels/base/formats.h"
#include "kernels/base/test_random.h"
#include "kernels/norm/norm.h"

namespace recfleet {
namespace {

std::vector<uint8_t> RandomTensor(DType dtype, int64_t n, double lo, double hi) {
  std::vector<double> v = RandomDoubles(n, lo, hi);
  std::vector<uint8_t> out(n * DTypeSize(dtype));
  TensorView t = MakeView(out.data(), dtype, {n});
  for (int64_t i = 0; i < n; ++i) StoreFromDouble(t, i, v[i]);
  return out;
}

// max |a - b| / (1 + |b|), NaN-propagating.
double MaxRelDiff(const TensorView& a, const TensorView& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double bb = LoadAsDouble(b, i);
    const double d = std::fabs(LoadAsDouble(a, i) - bb) / (1 + std::fabs(bb));
    if (!(d <= m)) m = d;
  }
  return m;
}

void Check(bool layer_norm, DType dtype, int64_t rows, int64_t dim) {
  SCOPED_TRACE(::testing::Message() << (layer_norm ? "LayerNorm " : "RMSNorm ") << DTypeName(dtype)
                                    << " [" << rows << ", " << dim << "]");
  const int64_t n = rows * dim;
  std::vector<uint8_t> x = RandomTensor(dtype, n, -2, 3), dy = RandomTensor(dtype, n, -1, 1);
  std::vector<uint8_t> gamma = RandomTensor(DType::kFloat32, dim, 0.5, 1.5),
                       beta = RandomTensor(DType::kFloat32, dim, -1, 1);
  DeviceBuffer dx_(x), ddy(dy), dgam(gamma), dbet(beta), dy_out(n * DTypeSize(dtype)),
      dmean(rows * 4), drstd(rows * 4), ddx(n * DTypeSize(dtype)), ddg(dim * 4), ddb(dim * 4);
  CudaOrDie(cudaMemset(dy_out.get(), 0xFF, dy_out.bytes()), "poison");
  CudaOrDie(cudaMemset(ddx.get(), 0xFF, ddx.bytes()), "poison");
  std::vector<uint8_t> y(n * DTypeSize(dtype)), dxh(n * DTypeSize(dtype));
  std::vector<float> mean(rows), rstd(rows), dg(dim), db(dim);
  auto h = [](auto& v, DType t, Shape s) { return MakeView(v.data(), t, std::move(s)); };
  const float eps = 1e-5f;
  const Shape xs = {rows, dim};
  if (layer_norm) {
    ASSERT_TRUE(LayerNormForward(h(x, dtype, xs), h(gamma, DType::kFloat32, {dim}),
                                 h(beta, DType::kFloat32, {dim}), eps, h(y, dtype, xs),
                                 h(mean, DType::kFloat32, {rows}), h(rstd, DType::kFloat32, {rows}))
                    .ok());
    ASSERT_TRUE(LayerNormForward(dx_.View(dtype, xs), dgam.View(DType::kFloat32, {dim}),
                                 dbet.View(DType::kFloat32, {dim}), eps, dy_out.View(dtype, xs),
                                 dmean.View(DType::kFloat32, {rows}),
                                 drstd.View(DType::kFloat32, {rows}))
                    .ok());
  } else {
    ASSERT_TRUE(RmsNormForward(h(x, dtype, xs), h(gamma, DType::kFloat32, {dim}), eps,
                               h(y, dtype, xs), h(rstd, DType::kFloat32, {rows}))
                    .ok());
    ASSERT_TRUE(RmsNormForward(dx_.View(dtype, xs), dgam.View(DType::kFloat32, {dim}), eps,
                               dy_out.View(dtype, xs), drstd.View(DType::kFloat32, {rows}))
                    .ok());
  }
  const double tol = dtype == DType::kBFloat16 ? 1.0 / 64 : 1e-5;
  std::vector<uint8_t> y_gpu = dy_out.ToHost<uint8_t>();
  EXPECT_LE(MaxRelDiff(h(y_gpu, dtype, {n}), h(y, dtype, {n})), tol);
  std::vector<float> rstd_gpu = drstd.ToHost<float>();
  EXPECT_LE(MaxRelDiff(h(rstd_gpu, DType::kFloat32, {rows}), h(rstd, DType::kFloat32, {rows})),
            1e-5);

  // Backward from the CPU statistics on both sides.
  DeviceBuffer dmean_cpu(mean), drstd_cpu(rstd);
  auto gpu_backward = [&] {
    return layer_norm
               ? LayerNormBackward(ddy.View(dtype, xs), dx_.View(dtype, xs),
                                   dgam.View(DType::kFloat32, {dim}),
                                   dmean_cpu.View(DType::kFloat32, {rows}),
                                   drstd_cpu.View(DType::kFloat32, {rows}), ddx.View(dtype, xs),
                                   ddg.View(DType::kFloat32, {dim}), ddb.View(DType::kFloat32, {dim}))
               : RmsNormBackward(ddy.View(dtype, xs), dx_.View(dtype, xs),
                                 dgam.View(DType::kFloat32, {dim}),
                                 drstd_cpu.View(DType::kFloat32, {rows}), ddx.View(dtype, xs),
                                 ddg.View(DType::kFloat32, {dim}));
  };
  if (layer_norm) {
    ASSERT_TRUE(LayerNormBackward(h(dy, dtype, xs), h(x, dtype, xs), h(gamma, DType::kFloat32, {dim}),
                                  h(mean, DType::kFloat32, {rows}), h(rstd, DType::kFloat32, {rows}),
                                  h(dxh, dtype, xs), h(dg, DType::kFloat32, {dim}),
                                  h(db, DType::kFloat32, {dim}))
                    .ok());
  } else {
    ASSERT_TRUE(RmsNormBackward(h(dy, dtype, xs), h(x, dtype, xs), h(gamma, DType::kFloat32, {dim}),
                                h(rstd, DType::kFloat32, {rows}), h(dxh, dtype, xs),
                                h(dg, DType::kFloat32, {dim}))
                    .ok());
  }
  ASSERT_TRUE(gpu_backward().ok());
  std::vector<uint8_t> dx_gpu = ddx.ToHost<uint8_t>();
  EXPECT_LE(MaxRelDiff(h(dx_gpu, dtype, {n}), h(dxh, dtype, {n})), 4 * tol);
  std::vector<float> dg_gpu = ddg.ToHost<float>();
  // Column sums over `rows` terms of size ~1.
  EXPECT_LE(MaxRelDiff(h(dg_gpu, DType::kFloat32, {dim}), h(dg, DType::kFloat32, {dim})),
            1e-5 * rows);
  std::vector<float> db_gpu;
  if (layer_norm) {
    db_gpu = ddb.ToHost<float>();
    EXPECT_LE(MaxRelDiff(h(db_gpu, DType::kFloat32, {dim}), h(db, DType::kFloat32, {dim})),
              1e-5 * rows);
  }
  // A second run gives the same bits (sums in a fixed order).
  ASSERT_TRUE(gpu_backward().ok());
  if (layer_norm) {
    EXPECT_EQ(ddb.ToHost<float>(), db_gpu);
  }
  EXPECT_EQ(ddg.ToHost<float>(), dg_gpu);
  EXPECT_EQ(ddx.ToHost<uint8_t>(), dx_gpu);

  // FP8 output: the same bits as quantizing the fp32 norm, up to the rare
  // element where fp32 vs double rounding of y crosses an FP8 tie.
  const int64_t nb = (dim + 127) / 128;
  std::vector<uint8_t> q(n);
  std::vector<float> scales(rows * nb);
  DeviceBuffer dq(n), dsc(rows * nb * 4);
  CudaOrDie(cudaMemset(dq.get(), 0x7F, dq.bytes()), "poison");  // NaN codes
  CudaOrDie(cudaMemset(dsc.get(), 0xFF, dsc.bytes()), "poison");  // NaN scales
  CudaOrDie(cudaMemset(drstd.get(), 0xFF, drstd.bytes()), "poison");
  if (layer_norm) {
    ASSERT_TRUE(LayerNormForwardFp8(h(x, dtype, xs), h(gamma, DType::kFloat32, {dim}),
                                    h(beta, DType::kFloat32, {dim}), eps,
                                    h(q, DType::kFloat8E4M3, xs), h(scales, DType::kFloat32, {rows, nb}),
                                    h(mean, DType::kFloat32, {rows}), h(rstd, DType::kFloat32, {rows}))
                    .ok());
    ASSERT_TRUE(LayerNormForwardFp8(dx_.View(dtype, xs), dgam.View(DType::kFloat32, {dim}),
                                    dbet.View(DType::kFloat32, {dim}), eps,
                                    dq.View(DType::kFloat8E4M3, xs),
                                    dsc.View(DType::kFloat32, {rows, nb}),
                                    dmean.View(DType::kFloat32, {rows}),
                                    drstd.View(DType::kFloat32, {rows}))
                    .ok());
  } else {
    ASSERT_TRUE(RmsNormForwardFp8(h(x, dtype, xs), h(gamma, DType::kFloat32, {dim}), eps,
                                  h(q, DType::kFloat8E4M3, xs), h(scales, DType::kFloat32, {rows, nb}),
                                  h(rstd, DType::kFloat32, {rows}))
                    .ok());
    ASSERT_TRUE(RmsNormForwardFp8(dx_.View(dtype, xs), dgam.View(DType::kFloat32, {dim}), eps,
                                  dq.View(DType::kFloat8E4M3, xs),
                                  dsc.View(DType::kFloat32, {rows, nb}),
                                  drstd.View(DType::kFloat32, {rows}))
                    .ok());
  }
  std::vector<uint8_t> q_gpu = dq.ToHost<uint8_t>();
  std::vector<float> sc_gpu = dsc.ToHost<float>();
  EXPECT_LE(MaxRelDiff(h(sc_gpu, DType::kFloat32, {rows * nb}), h(scales, DType::kFloat32, {rows * nb})),
            1e-5);
  std::vector<float> rstd_fp8 = drstd.ToHost<float>();
  EXPECT_LE(MaxRelDiff(h(rstd_fp8, DType::kFloat32, {rows}), h(rstd, DType::kFloat32, {rows})),
            1e-5);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (q_gpu[i] == q[i]) continue;
    ++differ;
    EXPECT_LE(std::abs(int{q_gpu[i]} - int{q[i]}), 1) << "element " << i;
  }
  EXPECT_LE(differ, n / 1000 + 1);
}

TEST(NormCudaTest, MatchesCpuReference) {
  for (bool ln : {false, true}) {
    for (DType t : {DType::kFloat32, DType::kBFloat16}) {
      // Whole 128-column segments take the row kernel: 8 segments (half of
      // the half-warps idle), 5 (odd count), 18 (a partly used second slot),
      // 64 and 128 (4 and 8 slots per half-warp); 160 segments do not fit it.
      Check(ln, t, 64, 1024);
      Check(ln, t, 9, 640);
      Check(ln, t, 7, 2304);
      Check(ln, t, 37, 8192);
      Check(ln, t, 5, 16384);
      Check(ln, t, 3, 20480);
      Check(ln, t, 33, 300);  // partial 128-segment, odd rows
      // The backward's row kernel (widths 32 x 2^k up to 1,024): rows not
      // a multiple of its 8 warps or of its 256 blocks, and more rows than
      // blocks x warps.
      Check(ln, t, 3001, 256);
      Check(ln, t, 517, 128);
      Check(ln, t, 13, 32);
      Check(ln, t, 129, 64);
      Check(ln, t, 2049, 512);
      Check(ln, t, 300, 1);
    }
  }
}

}  // namespace
}  // namespace recfleet
