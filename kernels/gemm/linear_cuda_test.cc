// cuBLASLt linear-layer GEMMs against the CPU reference on fresh random data.
// The reference performs the same operand conversion (bf16 rounding, or
// bit-identical FP8 block quantization), so the only difference left is
// accumulation order and the tensor cores' accumulator: a wrong scale
// layout or transpose shows up as O(1) errors.

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gemm/linear.h"
#include "kernels/quant/device_buffer.h"
#include "kernels/quant/formats.h"
#include "kernels/quant/test_random.h"

namespace recfleet {
namespace {

std::vector<uint8_t> RandomTensor(DType dtype, int64_t n) {
  std::vector<double> v = RandomDoubles(n, -1, 1);
  std::vector<uint8_t> out(n * DTypeSize(dtype));
  TensorView t = MakeView(out.data(), dtype, {n});
  for (int64_t i = 0; i < n; ++i) StoreFromDouble(t, i, v[i]);
  return out;
}

// Largest |gpu - cpu| relative to the size of one k-term sum of products
// of magnitude <= 1, sqrt(k) (random signs).
double Error(const std::vector<uint8_t>& gpu, const std::vector<uint8_t>& cpu, DType dtype,
             int64_t k) {
  const int64_t n = gpu.size() / DTypeSize(dtype);
  TensorView g = MakeView(const_cast<uint8_t*>(gpu.data()), dtype, {n});
  TensorView c = MakeView(const_cast<uint8_t*>(cpu.data()), dtype, {n});
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = std::fabs(LoadAsDouble(g, i) - LoadAsDouble(c, i)) / std::sqrt(double(k));
    if (!(e <= worst)) worst = e;
  }
  return worst;
}

void Check(GemmPrecision p, DType in, DType out, int64_t m, int64_t n, int64_t k) {
  SCOPED_TRACE(::testing::Message() << GemmPrecisionName(p) << " " << DTypeName(in) << " -> "
                                    << DTypeName(out) << " m=" << m << " n=" << n << " k=" << k);
  const LinearRecipe r{p, p, p};
  std::vector<uint8_t> x = RandomTensor(in, m * k), w = RandomTensor(in, n * k),
                       dy = RandomTensor(in, m * n), bias = RandomTensor(DType::kFloat32, n);
  DeviceBuffer dx_(x), dw_(w), ddy(dy), dbias(bias);
  const size_t es = DTypeSize(out);
  std::vector<uint8_t> y(m * n * es), gx(m * k * es);
  std::vector<uint8_t> gw_acc = RandomTensor(out, n * k), gb_acc = RandomTensor(DType::kFloat32, n);
  DeviceBuffer dy_out(y.size()), dgx(gx.size()), dgw(gw_acc), dgb(gb_acc);
  auto h = [](std::vector<uint8_t>& v, DType t, Shape s) { return MakeView(v.data(), t, std::move(s)); };

  ASSERT_TRUE(LinearForward(h(x, in, {m, k}), h(w, in, {n, k}), h(bias, DType::kFloat32, {n}),
                            h(y, out, {m, n}), r)
                  .ok());
  absl::Status s = LinearForward(dx_.View(in, {m, k}), dw_.View(in, {n, k}),
                                 dbias.View(DType::kFloat32, {n}), dy_out.View(out, {m, n}), r);
  ASSERT_TRUE(s.ok()) << s;
  const double tol = out == DType::kBFloat16 ? 0.02 : (p == GemmPrecision::kFp8Block ? 2e-3 : 1e-4);
  EXPECT_LE(Error(dy_out.ToHost<uint8_t>(), y, out, k), tol) << "forward";

  ASSERT_TRUE(LinearBackwardInput(h(dy, in, {m, n}), h(w, in, {n, k}), h(gx, out, {m, k}), r).ok());
  s = LinearBackwardInput(ddy.View(in, {m, n}), dw_.View(in, {n, k}), dgx.View(out, {m, k}), r);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_LE(Error(dgx.ToHost<uint8_t>(), gx, out, n), tol) << "dgrad";

  // Weight gradient accumulated onto existing random values.
  std::vector<uint8_t> gw_cpu = gw_acc, gb_cpu = gb_acc;
  ASSERT_TRUE(LinearBackwardWeight(h(dy, in, {m, n}), h(x, in, {m, k}), h(gw_cpu, out, {n, k}),
                                   h(gb_cpu, DType::kFloat32, {n}), true, r)
                  .ok());
  s = LinearBackwardWeight(ddy.View(in, {m, n}), dx_.View(in, {m, k}), dgw.View(out, {n, k}),
                           dgb.View(DType::kFloat32, {n}), true, r);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_LE(Error(dgw.ToHost<uint8_t>(), gw_cpu, out, m), tol) << "wgrad";
  EXPECT_LE(Error(dgb.ToHost<uint8_t>(), gb_cpu, DType::kFloat32, m), 1e-5) << "dbias";
}

TEST(LinearCudaTest, MatchesCpuReference) {
  Check(GemmPrecision::kNative, DType::kFloat32, DType::kFloat32, 96, 80, 112);
  Check(GemmPrecision::kNative, DType::kBFloat16, DType::kBFloat16, 128, 64, 256);
  Check(GemmPrecision::kBf16, DType::kFloat32, DType::kFloat32, 100, 72, 136);
  Check(GemmPrecision::kBf16, DType::kBFloat16, DType::kBFloat16, 256, 384, 512);
  Check(GemmPrecision::kFp8Block, DType::kBFloat16, DType::kBFloat16, 256, 384, 512);
  Check(GemmPrecision::kFp8Block, DType::kBFloat16, DType::kFloat32, 256, 384, 512);
  Check(GemmPrecision::kFp8Block, DType::kFloat32, DType::kFloat32, 208, 144, 272);  // partial blocks
}

}  // namespace
}  // namespace recfleet
