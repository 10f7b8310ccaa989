// cuBLASLt linear-layer GEMMs against the CPU reference on fresh random data.
// The reference performs the same operand conversion (bf16 rounding, or
// bit-identical FP8 block quantization), so the only difference left is
// accumulation order and the tensor cores' accumulator: a wrong scale
// layout or transpose shows up as O(1) errors.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/device_buffer.h"
#include "kernels/base/formats.h"
#include "kernels/base/test_random.h"
#include "kernels/gemm/linear.h"
#include "kernels/quant/quantize.h"

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

// Relative Frobenius error of got against want.
double RelativeL2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * double(got[i] - want[i]);
    den += want[i] * double(want[i]);
  }
  return std::sqrt(num / den);
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

// A LinearContext changes where quantized operands come from, not their
// bytes: forward, dgrad and wgrad match the context-free calls exactly, and
// after InvalidateWeight() the new weight is used. M = 208 is not a
// multiple of 128: with the Hadamard transform the context keeps no x^T or
// dy^T and the wgrad pads dy and x with zero rows itself.
TEST(LinearCudaTest, ContextReusesQuantizedOperandsExactly) {
  const int64_t k = 384, n = 512;
  const DType bf = DType::kBFloat16;
  for (int run = 0; run < 4; ++run) {
    const int64_t m = run < 2 ? 256 : 208;
    const int options = run % 2;
    SCOPED_TRACE(::testing::Message() << (options ? "wgrad Hadamard + stochastic" : "plain FP8")
                                      << " m=" << m);
    LinearRecipe r{GemmPrecision::kFp8Block, GemmPrecision::kFp8Block, GemmPrecision::kFp8Block};
    r.wgrad_hadamard = r.wgrad_stochastic = options == 1;
    r.seed = TestRng()();
    DeviceBuffer x(RandomTensor(bf, m * k)), w(RandomTensor(bf, n * k)),
        dy(RandomTensor(bf, m * n));
    auto step = [&](LinearContext* ctx) {
      DeviceBuffer y(m * n * 2), dx(m * k * 2), dw(n * k * 2);
      EXPECT_TRUE(LinearForward(x.View(bf, {m, k}), w.View(bf, {n, k}), TensorView(),
                                y.View(bf, {m, n}), r, nullptr, ctx)
                      .ok());
      EXPECT_TRUE(LinearBackwardInput(dy.View(bf, {m, n}), w.View(bf, {n, k}), dx.View(bf, {m, k}),
                                      r, nullptr, ctx)
                      .ok());
      EXPECT_TRUE(LinearBackwardWeight(dy.View(bf, {m, n}), x.View(bf, {m, k}),
                                       dw.View(bf, {n, k}), TensorView(), false, r, nullptr, ctx)
                      .ok());
      return std::vector<std::vector<uint8_t>>{y.ToHost<uint8_t>(), dx.ToHost<uint8_t>(),
                                               dw.ToHost<uint8_t>()};
    };
    LinearContext ctx;
    EXPECT_EQ(step(&ctx), step(nullptr));
    EXPECT_EQ(step(&ctx), step(nullptr)) << "second step, cached weight";
    const std::vector<uint8_t> w2 = RandomTensor(bf, n * k);
    CudaOrDie(cudaMemcpy(w.get(), w2.data(), w2.size(), cudaMemcpyHostToDevice), "new w");
    ctx.InvalidateWeight();
    EXPECT_EQ(step(&ctx), step(nullptr)) << "after InvalidateWeight";

    // Against the CPU reference of the same recipe (its Hadamard runs in
    // double, the kernel's in fp32: FP8 rounding may differ in a few places).
    std::vector<uint8_t> hx = RandomTensor(bf, m * k), hdy = RandomTensor(bf, m * n);
    CudaOrDie(cudaMemcpy(x.get(), hx.data(), hx.size(), cudaMemcpyHostToDevice), "x");
    CudaOrDie(cudaMemcpy(dy.get(), hdy.data(), hdy.size(), cudaMemcpyHostToDevice), "dy");
    std::vector<float> want(n * k);
    ASSERT_TRUE(LinearBackwardWeight(MakeView(hdy.data(), bf, {m, n}), MakeView(hx.data(), bf, {m, k}),
                                     MakeView(want.data(), DType::kFloat32, {n, k}), TensorView(),
                                     false, r)
                    .ok());
    DeviceBuffer dw(n * k * 4);
    ASSERT_TRUE(LinearBackwardWeight(dy.View(bf, {m, n}), x.View(bf, {m, k}),
                                     dw.View(DType::kFloat32, {n, k}), TensorView(), false, r)
                    .ok());
    EXPECT_LT(RelativeL2(dw.ToHost<float>(), want), options ? 2e-2 : 1e-3);
  }
}

// FP8 forward and dgrad with a bf16 weight gradient on fp32 activations:
// the context's quantize passes also write the bf16 x and dy that wgrad
// reads, in place of the casts the context-free wgrad makes. The results are
// the same bits, where the row kernel writes the copy (k and n multiples of
// 128) and where a cast after the tile kernel does (272 x 144). New values
// at the same addresses are seen (each forward drops the copies), and a wgrad
// with no dgrad before it casts dy itself rather than reading a copy of an
// earlier dy.
TEST(LinearCudaTest, Bf16WgradReadsTheCopiesOfTheQuantizePasses) {
  const DType f32 = DType::kFloat32;
  const LinearRecipe r{GemmPrecision::kFp8Block, GemmPrecision::kFp8Block, GemmPrecision::kBf16};
  for (const auto& [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{256, 384, 512},
                                {208, 272, 144}}) {
    SCOPED_TRACE(::testing::Message() << "m=" << m << " k=" << k << " n=" << n);
    DeviceBuffer x(RandomTensor(f32, m * k)), w(RandomTensor(f32, n * k)),
        dy(RandomTensor(f32, m * n));
    auto step = [&](LinearContext* ctx, bool dgrad) {
      DeviceBuffer y(m * n * 4), dx(m * k * 4), dw(n * k * 4);
      EXPECT_TRUE(LinearForward(x.View(f32, {m, k}), w.View(f32, {n, k}), TensorView(),
                                y.View(f32, {m, n}), r, nullptr, ctx)
                      .ok());
      if (dgrad) {
        EXPECT_TRUE(LinearBackwardInput(dy.View(f32, {m, n}), w.View(f32, {n, k}),
                                        dx.View(f32, {m, k}), r, nullptr, ctx)
                        .ok());
      }
      EXPECT_TRUE(LinearBackwardWeight(dy.View(f32, {m, n}), x.View(f32, {m, k}),
                                       dw.View(f32, {n, k}), TensorView(), false, r, nullptr, ctx)
                      .ok());
      return std::vector<std::vector<uint8_t>>{y.ToHost<uint8_t>(),
                                               dgrad ? dx.ToHost<uint8_t>() : std::vector<uint8_t>{},
                                               dw.ToHost<uint8_t>()};
    };
    auto refill = [&](DeviceBuffer& b, int64_t count) {
      const std::vector<uint8_t> v = RandomTensor(f32, count);
      CudaOrDie(cudaMemcpy(b.get(), v.data(), v.size(), cudaMemcpyHostToDevice), "refill");
    };
    LinearContext ctx;
    EXPECT_EQ(step(&ctx, true), step(nullptr, true));
    refill(x, m * k);
    refill(dy, m * n);
    EXPECT_EQ(step(&ctx, true), step(nullptr, true)) << "new x and dy at the same addresses";
    // A forward and dgrad whose wgrad never came, then a step without dgrad
    // on new dy values at the same address.
    DeviceBuffer y(m * n * 4), dx(m * k * 4);
    ASSERT_TRUE(LinearForward(x.View(f32, {m, k}), w.View(f32, {n, k}), TensorView(),
                              y.View(f32, {m, n}), r, nullptr, &ctx)
                    .ok());
    ASSERT_TRUE(LinearBackwardInput(dy.View(f32, {m, n}), w.View(f32, {n, k}),
                                    dx.View(f32, {m, k}), r, nullptr, &ctx)
                    .ok());
    refill(dy, m * n);
    EXPECT_EQ(step(&ctx, false), step(nullptr, false)) << "wgrad without dgrad";
    // The bf16 recipe's product, to within bf16 rounding of the operands:
    // the copies are x and dy in bf16.
    DeviceBuffer dw_bf16(n * k * 4);
    const LinearRecipe all_bf16{GemmPrecision::kBf16, GemmPrecision::kBf16, GemmPrecision::kBf16};
    ASSERT_TRUE(LinearBackwardWeight(dy.View(f32, {m, n}), x.View(f32, {m, k}),
                                     dw_bf16.View(f32, {n, k}), TensorView(), false, all_bf16)
                    .ok());
    std::vector<float> got(n * k);
    const std::vector<uint8_t> raw = step(&ctx, true)[2];
    std::memcpy(got.data(), raw.data(), raw.size());
    EXPECT_EQ(got, dw_bf16.ToHost<float>());
  }
}

// Codes handed in (LinearContext::SetWeight, as FSDP's FP8 all-gather does)
// are what the FP8 GEMMs then use: given Quantize(w)'s own codes and tile
// scales, forward, dgrad and wgrad equal the context that quantizes w itself,
// bit for bit; given another weight's codes they compute with that weight
// (so nothing re-quantizes w); InvalidateWeight returns to quantizing w.
// Partial tiles (208 x 272) and tile scales spread over 2^12, so a scale in
// the wrong tile or a wrong transpose shows.
TEST(LinearCudaTest, SetWeightUsesTheCodesItIsGiven) {
  const int64_t m = 256, n = 208, k = 272;
  const DType f32 = DType::kFloat32;
  const LinearRecipe r{GemmPrecision::kFp8Block, GemmPrecision::kFp8Block,
                       GemmPrecision::kFp8Block};
  auto spread_weight = [&] {
    std::vector<float> w(n * k);
    std::vector<double> v = RandomDoubles(n * k, -1, 1);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        w[i * k + j] = static_cast<float>(v[i * k + j] * std::ldexp(1.0, -int((i / 128 * 5 + j / 128 * 3) % 13)));
      }
    }
    return w;
  };
  const std::vector<float> hw = spread_weight(), hw2 = spread_weight();
  DeviceBuffer x(RandomTensor(f32, m * k)), dy(RandomTensor(f32, m * n)), w(hw), w2(hw2);
  const Shape tiles = QuantScaleShape(n, k, ScaleBlock::k128x128);
  const int64_t num_tiles = tiles[0] * tiles[1];
  const DType e4m3 = DType::kFloat8E4M3;
  DeviceBuffer q(n * k), scales(num_tiles * 4), q2(n * k), scales2(num_tiles * 4);
  for (auto [weight, codes, sc] : {std::tuple{&w, &q, &scales}, {&w2, &q2, &scales2}}) {
    const absl::Status s = Quantize(weight->View(f32, {n, k}), QuantizeConfig{ScaleBlock::k128x128},
                                    false, codes->View(e4m3, {n, k}), sc->View(f32, tiles));
    ASSERT_TRUE(s.ok()) << s;
  }
  auto step = [&](DeviceBuffer& weight, LinearContext* ctx) {
    DeviceBuffer y(m * n * 4), dx(m * k * 4), dw(n * k * 4);
    EXPECT_TRUE(LinearForward(x.View(f32, {m, k}), weight.View(f32, {n, k}), TensorView(),
                              y.View(f32, {m, n}), r, nullptr, ctx)
                    .ok());
    EXPECT_TRUE(LinearBackwardInput(dy.View(f32, {m, n}), weight.View(f32, {n, k}),
                                    dx.View(f32, {m, k}), r, nullptr, ctx)
                    .ok());
    EXPECT_TRUE(LinearBackwardWeight(dy.View(f32, {m, n}), x.View(f32, {m, k}),
                                     dw.View(f32, {n, k}), TensorView(), false, r, nullptr, ctx)
                    .ok());
    return std::vector<std::vector<float>>{y.ToHost<float>(), dx.ToHost<float>(),
                                           dw.ToHost<float>()};
  };
  LinearContext own, given;
  const auto want = step(w, &own), want2 = step(w2, nullptr);
  ASSERT_TRUE(given.SetWeight(w.View(f32, {n, k}), q.View(e4m3, {n, k}),
                              scales.View(f32, {num_tiles}))
                  .ok());
  EXPECT_EQ(step(w, &given), want) << "w's own codes";
  EXPECT_EQ(step(w, &given), want) << "again, still cached";
  // Codes not 16-byte aligned take the kernel's byte-wise path.
  DeviceBuffer shifted(n * k + 8);
  CudaOrDie(cudaMemcpy(static_cast<char*>(shifted.get()) + 8, q.get(), n * k, cudaMemcpyDeviceToDevice),
            "shift codes");
  LinearContext unaligned;
  ASSERT_TRUE(unaligned
                  .SetWeight(w.View(f32, {n, k}),
                             MakeView(static_cast<char*>(shifted.get()) + 8, e4m3, {n, k}, Device::kCuda),
                             scales.View(f32, {num_tiles}))
                  .ok());
  EXPECT_EQ(step(w, &unaligned), want) << "unaligned codes";
  ASSERT_TRUE(given.SetWeight(w.View(f32, {n, k}), q2.View(e4m3, {n, k}),
                              scales2.View(f32, {num_tiles}))
                  .ok());
  const auto got2 = step(w, &given);
  EXPECT_EQ(got2[0], want2[0]) << "forward with w2's codes";
  EXPECT_EQ(got2[1], want2[1]) << "dgrad with w2's codes";
  given.InvalidateWeight();
  EXPECT_EQ(step(w, &given), want) << "after InvalidateWeight";
  // Shapes and the format are checked.
  EXPECT_FALSE(given.SetWeight(w.View(f32, {n, k}), q.View(e4m3, {k, n - 16}),
                               scales.View(f32, {num_tiles}))
                   .ok());
  EXPECT_FALSE(given.SetWeight(w.View(f32, {n, k}), q.View(e4m3, {n, k}),
                               scales.View(f32, {tiles[0]}))
                   .ok());
  EXPECT_FALSE(given.SetWeight(w.View(f32, {n, k}), q.View(DType::kFloat8E5M2, {n, k}),
                               scales.View(f32, {num_tiles}))
                   .ok())
      << "E5M2 codes are not the GEMMs' weight format";
}

// The same at the size of a large layer, 8,192 x 8,192 (4,096 tiles): the
// forward from handed-in codes equals the self-quantizing one bit for bit,
// and the time to take the codes (copy + transpose, 1 byte in and 2 out per
// element) is printed beside the time the context takes to quantize the
// fp32 weight into W and W^T (4 bytes in, 2 out), medians of 20
// CUDA-event-timed calls.
TEST(LinearCudaTest, SetWeightAtScale) {
  const int64_t m = 128, n = 8192, k = 8192;
  const DType f32 = DType::kFloat32, e4m3 = DType::kFloat8E4M3;
  const LinearRecipe r{GemmPrecision::kFp8Block, GemmPrecision::kFp8Block,
                       GemmPrecision::kFp8Block};
  const Shape tiles = QuantScaleShape(n, k, ScaleBlock::k128x128);
  const int64_t num_tiles = tiles[0] * tiles[1];
  DeviceBuffer x(RandomTensor(f32, m * k)), w(RandomTensor(f32, n * k)), q(n * k),
      scales(num_tiles * 4), y(m * n * 4);
  ASSERT_TRUE(Quantize(w.View(f32, {n, k}), QuantizeConfig{ScaleBlock::k128x128}, false,
                       q.View(e4m3, {n, k}), scales.View(f32, tiles))
                  .ok());
  LinearContext own, given;
  auto forward_only = [&](LinearContext* ctx) {
    EXPECT_TRUE(LinearForward(x.View(f32, {m, k}), w.View(f32, {n, k}), TensorView(),
                              y.View(f32, {m, n}), r, nullptr, ctx)
                    .ok());
  };
  auto forward = [&](LinearContext* ctx) {
    forward_only(ctx);
    return y.ToHost<float>();
  };
  const std::vector<float> want = forward(&own);
  ASSERT_TRUE(given.SetWeight(w.View(f32, {n, k}), q.View(e4m3, {n, k}),
                              scales.View(f32, {num_tiles}))
                  .ok());
  EXPECT_EQ(forward(&given), want);
  cudaEvent_t start, stop;
  CudaOrDie(cudaEventCreate(&start), "event");
  CudaOrDie(cudaEventCreate(&stop), "event");
  auto median_ms = [&](const std::function<void()>& fn) {
    std::vector<float> ms;
    for (int i = 0; i < 23; ++i) {
      CudaOrDie(cudaEventRecord(start), "record");
      fn();
      CudaOrDie(cudaEventRecord(stop), "record");
      CudaOrDie(cudaEventSynchronize(stop), "sync");
      float t = 0;
      CudaOrDie(cudaEventElapsedTime(&t, start, stop), "elapsed");
      if (i >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  // The context's own weight quantization (W and W^T from one read of the
  // fp32 weight): a forward after InvalidateWeight less a forward on the
  // cached weight.
  const float cached_ms = median_ms([&] { forward_only(&own); });
  const float requantized_ms = median_ms([&] {
    own.InvalidateWeight();
    forward_only(&own);
  });
  const float quantize_ms = requantized_ms - cached_ms;
  const float set_ms = median_ms([&] {
    EXPECT_TRUE(given.SetWeight(w.View(f32, {n, k}), q.View(e4m3, {n, k}),
                                scales.View(f32, {num_tiles}))
                    .ok());
  });
  std::printf("8192 x 8192 weight: SetWeight (codes -> W, W^T) %.3f ms; the context quantizing "
              "the fp32 weight into W and W^T %.3f ms (forward %.3f ms after InvalidateWeight, "
              "%.3f ms cached)\n",
              set_ms, quantize_ms, requantized_ms, cached_ms);
  CudaOrDie(cudaEventDestroy(start), "event");
  CudaOrDie(cudaEventDestroy(stop), "event");
}

// The Hadamard + stochastic wgrad alone at M = 200 (not even a multiple of
// 16; one whole 128-row group and a partial one): the GEMM runs on dy and x
// padded with zero rows to 256. Bit for bit the result of the same call on
// explicitly padded operands, and close to the CPU reference, which pads the
// same way (its Hadamard in double, the kernel's in fp32: FP8 rounding may
// differ in a few places).
TEST(LinearCudaTest, HadamardStochasticWgradPadsAnyRowCount) {
  const int64_t m = 200, padded_m = 256, n = 64, k = 96;
  const DType f32 = DType::kFloat32;
  LinearRecipe r{GemmPrecision::kFp8Block, GemmPrecision::kFp8Block, GemmPrecision::kFp8Block};
  r.wgrad_hadamard = r.wgrad_stochastic = true;
  r.seed = TestRng()();
  std::vector<uint8_t> x = RandomTensor(f32, m * k), dy = RandomTensor(f32, m * n);
  std::vector<float> want(n * k);
  ASSERT_TRUE(LinearBackwardWeight(MakeView(dy.data(), f32, {m, n}), MakeView(x.data(), f32, {m, k}),
                                   MakeView(want.data(), f32, {n, k}), TensorView(), false, r)
                  .ok());
  auto wgrad = [&](const std::vector<uint8_t>& hx, const std::vector<uint8_t>& hdy, int64_t rows) {
    DeviceBuffer gx(hx), gdy(hdy), gdw(n * k * 4);
    const absl::Status s = LinearBackwardWeight(gdy.View(f32, {rows, n}), gx.View(f32, {rows, k}),
                                                gdw.View(f32, {n, k}), TensorView(), false, r);
    EXPECT_TRUE(s.ok()) << s;
    return gdw.ToHost<float>();
  };
  const std::vector<float> got = wgrad(x, dy, m);
  EXPECT_LT(RelativeL2(got, want), 2e-2);
  std::vector<uint8_t> padded_x = x, padded_dy = dy;
  padded_x.resize(padded_m * k * 4, 0);
  padded_dy.resize(padded_m * n * 4, 0);
  EXPECT_EQ(got, wgrad(padded_x, padded_dy, padded_m));
}

// Engine-like data: block amaxes that differ by up to 2^16 between rows,
// 128-row groups, columns and weight blocks (uniform test data gives every
// 1x128 block nearly the same scale, so a scale read from the wrong block
// would pass the tests above). fp32 operands, an FP8 weight gradient whose
// x^T and dy^T come from the forward and dgrad through a LinearContext, and
// dW accumulated (beta = 1), as the engine's Linear runs them. Each output
// element must match the CPU reference to 1e-3 of |A| |B|^T at that element
// (the CPU reference of the absolute values: quantization commutes with
// |.|), so even the smallest blocks are checked.
TEST(LinearCudaTest, Fp8ScalesFollowTheirBlocksWithContext) {
  const DType f32 = DType::kFloat32;
  const LinearRecipe r{GemmPrecision::kFp8Block, GemmPrecision::kFp8Block,
                       GemmPrecision::kFp8Block};
  std::uniform_int_distribution<int> exponent(-8, 8);
  // factor(i, j) = 2^(e_row(i) + e_group(i / 128, j)).
  auto skewed = [&](int64_t rows, int64_t cols, bool per_row, int64_t group_rows,
                    int64_t group_cols) {
    std::vector<double> v = RandomDoubles(rows * cols, -1, 1);
    std::vector<int> er(rows), eg(((rows + group_rows - 1) / group_rows) *
                                  ((cols + group_cols - 1) / group_cols));
    for (int& e : er) e = per_row ? exponent(TestRng()) : 0;
    for (int& e : eg) e = exponent(TestRng());
    const int64_t gc = (cols + group_cols - 1) / group_cols;
    std::vector<float> out(rows * cols), abs_out(rows * cols);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const double f = std::ldexp(1.0, er[i] + eg[(i / group_rows) * gc + j / group_cols]);
        out[i * cols + j] = static_cast<float>(v[i * cols + j] * f);
        abs_out[i * cols + j] = std::fabs(out[i * cols + j]);
      }
    }
    return std::pair<std::vector<float>, std::vector<float>>{out, abs_out};
  };
  for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{256, 64, 256},
                         {384, 272, 144},
                         {1024, 384, 512}}) {
    SCOPED_TRACE(::testing::Message() << "m=" << m << " k=" << k << " n=" << n);
    auto [x, x_abs] = skewed(m, k, true, 128, 1);
    auto [w, w_abs] = skewed(n, k, false, 128, 128);
    auto [dy, dy_abs] = skewed(m, n, true, 128, 1);
    auto host = [](std::vector<float>& v, Shape s) {
      return MakeView(v.data(), DType::kFloat32, std::move(s));
    };
    // CPU reference of the values and of their absolute values.
    std::vector<float> y(m * n), y_abs(m * n), dx(m * k), dx_abs(m * k), dw(n * k, 0.0f),
        dw_abs(n * k, 0.0f);
    ASSERT_TRUE(LinearForward(host(x, {m, k}), host(w, {n, k}), TensorView(), host(y, {m, n}), r).ok());
    ASSERT_TRUE(LinearForward(host(x_abs, {m, k}), host(w_abs, {n, k}), TensorView(),
                              host(y_abs, {m, n}), r).ok());
    ASSERT_TRUE(LinearBackwardInput(host(dy, {m, n}), host(w, {n, k}), host(dx, {m, k}), r).ok());
    ASSERT_TRUE(LinearBackwardInput(host(dy_abs, {m, n}), host(w_abs, {n, k}),
                                    host(dx_abs, {m, k}), r).ok());
    ASSERT_TRUE(LinearBackwardWeight(host(dy, {m, n}), host(x, {m, k}), host(dw, {n, k}),
                                     TensorView(), true, r).ok());
    ASSERT_TRUE(LinearBackwardWeight(host(dy_abs, {m, n}), host(x_abs, {m, k}),
                                     host(dw_abs, {n, k}), TensorView(), true, r).ok());
    // The engine's order through one context: forward, dgrad, wgrad.
    DeviceBuffer gx(x), gw(w), gdy(dy), gy(m * n * 4), gdx(m * k * 4),
        gdw(std::vector<float>(n * k, 0.0f));
    LinearContext ctx;
    absl::Status s = LinearForward(gx.View(f32, {m, k}), gw.View(f32, {n, k}), TensorView(),
                                   gy.View(f32, {m, n}), r, nullptr, &ctx);
    ASSERT_TRUE(s.ok()) << s;
    s = LinearBackwardInput(gdy.View(f32, {m, n}), gw.View(f32, {n, k}), gdx.View(f32, {m, k}), r,
                            nullptr, &ctx);
    ASSERT_TRUE(s.ok()) << s;
    s = LinearBackwardWeight(gdy.View(f32, {m, n}), gx.View(f32, {m, k}), gdw.View(f32, {n, k}),
                             TensorView(), true, r, nullptr, &ctx);
    ASSERT_TRUE(s.ok()) << s;
    auto worst = [](const std::vector<float>& got, const std::vector<float>& want,
                    const std::vector<float>& bound) {
      double e = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double d = std::fabs(double(got[i]) - want[i]) / (double(bound[i]) + 1e-30);
        if (!(d <= e)) e = d;
      }
      return e;
    };
    EXPECT_LE(worst(gy.ToHost<float>(), y, y_abs), 1e-3) << "forward";
    EXPECT_LE(worst(gdx.ToHost<float>(), dx, dx_abs), 1e-3) << "dgrad";
    EXPECT_LE(worst(gdw.ToHost<float>(), dw, dw_abs), 1e-3) << "wgrad";
  }
}

// An output the GEMM overwrites may hold anything, NaN included (the engine's
// pool hands out memory as the last user left it): with beta = 0 none of it
// may reach the result. Outputs are poisoned with NaN bytes; dx is also
// accumulated onto finite values (a fan-in). Every eighth row of dy is a
// nearly unused expert's gradient: zeros and one value of 1e-37, whose
// block scale amax / 448 is subnormal (its reciprocal once overflowed and
// the zeros encoded NaN). Shapes of the engine's FP8 layers: an expert's l1
// (N = 48, so the dgrad's K is 48) and a DCN layer.
TEST(LinearCudaTest, Fp8OutputsIgnoreThePoisonTheyOverwrite) {
  const DType f32 = DType::kFloat32;
  for (bool fp8_wgrad : {false, true}) {
    const LinearRecipe r{GemmPrecision::kFp8Block, GemmPrecision::kFp8Block,
                         fp8_wgrad ? GemmPrecision::kFp8Block : GemmPrecision::kBf16};
    for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{1024, 896, 48},
                           {1024, 896, 896},
                           {384, 272, 144}}) {
      SCOPED_TRACE(::testing::Message() << "m=" << m << " k=" << k << " n=" << n
                                        << " fp8 wgrad " << fp8_wgrad);
      std::vector<uint8_t> x = RandomTensor(f32, m * k), w = RandomTensor(f32, n * k),
                           dy = RandomTensor(f32, m * n), bias = RandomTensor(f32, n),
                           dx_acc = RandomTensor(f32, m * k);
      float* dyf = reinterpret_cast<float*>(dy.data());
      for (int64_t i = 0; i < m; i += 8) {
        for (int64_t j = 0; j < n; ++j) dyf[i * n + j] = j == i % n ? 1e-37f : 0.0f;
      }
      auto h = [](std::vector<uint8_t>& v, Shape s) { return MakeView(v.data(), DType::kFloat32, std::move(s)); };
      std::vector<uint8_t> y(m * n * 4), dx(m * k * 4), dx_sum = dx_acc, dw(n * k * 4);
      ASSERT_TRUE(LinearForward(h(x, {m, k}), h(w, {n, k}), h(bias, {n}), h(y, {m, n}), r).ok());
      ASSERT_TRUE(LinearBackwardInput(h(dy, {m, n}), h(w, {n, k}), h(dx, {m, k}), r).ok());
      ASSERT_TRUE(LinearBackwardInputAccumulate(h(dy, {m, n}), h(w, {n, k}), h(dx_sum, {m, k}), r).ok());
      ASSERT_TRUE(LinearBackwardWeight(h(dy, {m, n}), h(x, {m, k}), h(dw, {n, k}), TensorView(),
                                       false, r).ok());
      DeviceBuffer gx(x), gw(w), gdy(dy), gbias(bias), gdx_sum(dx_acc), gy(y.size()),
          gdx(dx.size()), gdw(dw.size());
      for (const DeviceBuffer* b : {&gy, &gdx, &gdw}) {
        CudaOrDie(cudaMemset(b->get(), 0xFF, b->bytes()), "poison");
      }
      LinearContext ctx;
      absl::Status s = LinearForward(gx.View(f32, {m, k}), gw.View(f32, {n, k}),
                                     gbias.View(f32, {n}), gy.View(f32, {m, n}), r, nullptr, &ctx);
      ASSERT_TRUE(s.ok()) << s;
      s = LinearBackwardInput(gdy.View(f32, {m, n}), gw.View(f32, {n, k}), gdx.View(f32, {m, k}),
                              r, nullptr, &ctx);
      ASSERT_TRUE(s.ok()) << s;
      s = LinearBackwardInputAccumulate(gdy.View(f32, {m, n}), gw.View(f32, {n, k}),
                                        gdx_sum.View(f32, {m, k}), r, nullptr, &ctx);
      ASSERT_TRUE(s.ok()) << s;
      s = LinearBackwardWeight(gdy.View(f32, {m, n}), gx.View(f32, {m, k}), gdw.View(f32, {n, k}),
                               TensorView(), false, r, nullptr, &ctx);
      ASSERT_TRUE(s.ok()) << s;
      struct Out {
        const char* name;
        std::vector<uint8_t> got;
        const std::vector<uint8_t>* want;
        int64_t k;
      };
      for (const Out& o : {Out{"forward", gy.ToHost<uint8_t>(), &y, k},
                           Out{"dgrad", gdx.ToHost<uint8_t>(), &dx, n},
                           Out{"dgrad accumulated", gdx_sum.ToHost<uint8_t>(), &dx_sum, n},
                           Out{"wgrad", gdw.ToHost<uint8_t>(), &dw, m}}) {
        const float* v = reinterpret_cast<const float*>(o.got.data());
        int64_t nonfinite = 0;
        for (size_t i = 0; i < o.got.size() / 4; ++i) nonfinite += !std::isfinite(v[i]);
        EXPECT_EQ(nonfinite, 0) << o.name;
        EXPECT_LE(Error(o.got, *o.want, f32, o.k), 2e-3) << o.name;
      }
    }
  }
}

}  // namespace
}  // namespace recfleet
