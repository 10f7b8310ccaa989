#include "kernels/quant/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/formats.h"
#include "kernels/base/minifloat.h"
#include "kernels/base/test_random.h"
#include "kernels/quant/tiled_testing.h"

namespace recfleet {
namespace {

struct Quantized {
  std::vector<uint8_t> q;
  std::vector<float> scales;
  Shape scale_shape;
};

Quantized QuantizeRef(std::vector<double>& x, int64_t rows, int64_t cols, const QuantizeConfig& cfg,
              bool transpose = false) {
  const int64_t qr = transpose ? cols : rows, qc = transpose ? rows : cols;
  Quantized out;
  out.q.resize(rows * cols);
  out.scale_shape = QuantScaleShape(qr, qc, cfg.block);
  out.scales.resize(out.scale_shape[0] * out.scale_shape[1]);
  absl::Status s = Quantize(MakeView(x.data(), DType::kFloat64, {rows, cols}), cfg, transpose,
                            MakeView(out.q.data(), cfg.format, {qr, qc}),
                            MakeView(out.scales.data(), DType::kFloat32, out.scale_shape));
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

std::vector<double> Dequant(Quantized& qd, int64_t rows, int64_t cols, const QuantizeConfig& cfg) {
  std::vector<double> x(rows * cols);
  absl::Status s = Dequantize(MakeView(qd.q.data(), cfg.format, {rows, cols}),
                              MakeView(qd.scales.data(), DType::kFloat32, qd.scale_shape),
                              cfg.block, MakeView(x.data(), DType::kFloat64, {rows, cols}));
  EXPECT_TRUE(s.ok()) << s;
  return x;
}

// Data with a wide dynamic range (and outliers) so blocks have different scales.
std::vector<double> WideRange(int64_t n) {
  std::vector<double> x = RandomDoubles(n, -1, 1);
  std::vector<double> e = RandomDoubles(n, -6, 6);
  for (int64_t i = 0; i < n; ++i) x[i] *= std::exp2(e[i]);
  return x;
}

TEST(Fp8FormatTest, EveryCodeRoundTripsAndTiesGoToEven) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) != 0x7F) {
      EXPECT_EQ(FloatToFp8E4M3(Fp8E4M3ToFloat(c)), c) << c;
    }
    if ((c & 0x7F) < 0x7C) {
      EXPECT_EQ(FloatToFp8E5M2(Fp8E5M2ToFloat(c)), c) << c;
    }
  }
  EXPECT_EQ(Fp8E4M3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(Fp8E5M2ToFloat(0x7B), 57344.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(FloatToFp8E4M3(1e6f)), 448.0f);     // saturates
  EXPECT_EQ(Fp8E4M3ToFloat(FloatToFp8E4M3(1.0625f)), 1.0f);    // tie -> even mantissa
  EXPECT_EQ(Fp8E4M3ToFloat(FloatToFp8E4M3(1.1875f)), 1.25f);   // tie -> even mantissa
  EXPECT_EQ(Fp8E4M3ToFloat(FloatToFp8E4M3(std::ldexp(1.0f, -10))), 0.0f);  // half smallest subnormal
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.00390625f)), 1.0f);
}

// Round-to-nearest error bound per format: half an ulp relative to the
// element in the normal range, half the subnormal step (times the block
// scale) below it.
void CheckNearestBound(DType format, ScaleBlock block, int64_t rows, int64_t cols) {
  std::vector<double> x = WideRange(rows * cols);
  QuantizeConfig cfg{block, format, Rounding::kNearest, 0};
  Quantized qd = QuantizeRef(x, rows, cols, cfg);
  std::vector<double> y = Dequant(qd, rows, cols, cfg);
  const int man = format == DType::kFloat8E4M3 ? 3 : 2;
  const int min_exp = format == DType::kFloat8E4M3 ? -6 : -14;
  const Shape ss = qd.scale_shape;
  const int64_t br = (rows + ss[0] - 1) / ss[0] > 1 ? (block == ScaleBlock::k32x32 ? 32 : 128) : 1;
  const int64_t bc = block == ScaleBlock::k32x32 ? 32 : 128;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const double s = qd.scales[(i / br) * ss[1] + j / bc];
      const double bound = std::max(std::fabs(x[i * cols + j]) * std::ldexp(1.0, -man - 1),
                                    s * std::ldexp(1.0, min_exp - man - 1));
      ASSERT_LE(std::fabs(y[i * cols + j] - x[i * cols + j]), bound * (1 + 1e-6))
          << DTypeName(format) << " " << ScaleBlockName(block) << " at " << i << "," << j;
    }
  }
}

TEST(QuantizeTest, NearestErrorBoundsPerFormatAndBlock) {
  for (DType f : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    CheckNearestBound(f, ScaleBlock::k1x128, 5, 300);
    CheckNearestBound(f, ScaleBlock::k128x128, 130, 257);
    CheckNearestBound(f, ScaleBlock::k32x32, 33, 95);
  }
}

TEST(QuantizeTest, BlockAmaxMapsToFormatMaxAndPow2ScalesNeverSaturate) {
  const int64_t rows = 64, cols = 96;
  std::vector<double> x = WideRange(rows * cols);
  QuantizeConfig cfg{ScaleBlock::k32x32, DType::kFloat8E4M3, Rounding::kNearest, 0};
  Quantized qd = QuantizeRef(x, rows, cols, cfg);
  for (float s : qd.scales) {
    int e;
    EXPECT_EQ(std::frexp(s, &e), 0.5f) << s;  // a power of two
  }
  for (int64_t i = 0; i < rows * cols; ++i) {
    EXPECT_LE(std::fabs(x[i]) / qd.scales[(i / cols / 32) * 3 + (i % cols) / 32], 448.0);
  }
  cfg.block = ScaleBlock::k1x128;
  qd = QuantizeRef(x, rows, cols, cfg);
  for (int64_t r = 0; r < rows; ++r) {
    double amax = 0;
    for (int64_t j = 0; j < cols; ++j) amax = std::max(amax, std::fabs(x[r * cols + j]));
    EXPECT_FLOAT_EQ(qd.scales[r], static_cast<float>(amax) / 448.0f);
  }
}

// Blocks whose amax lies below fmax * 2^-126 (the gradients of a nearly
// unused expert: mostly exact zeros and a few values near 1e-37): the
// reciprocal of amax / fmax would overflow to infinity and a zero would
// encode as 0 * inf = NaN. Every element must decode to a finite value
// within the format's error of the block (relative to its amax).
TEST(QuantizeTest, TinyBlocksWithZerosStayFinite) {
  const int64_t rows = 64, cols = 256;
  for (DType f : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    for (ScaleBlock b : {ScaleBlock::k1x128, ScaleBlock::k128x128, ScaleBlock::k32x32}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(f) << " " << ScaleBlockName(b));
      std::vector<double> x(rows * cols, 0.0);
      // Row r holds zeros and one tiny value, from 1e-37 (a normal amax whose
      // amax / fmax is subnormal) down to subnormal amaxes; row 0 stays zero.
      for (int64_t r = 1; r < rows; ++r) {
        x[r * cols + (r * 37) % cols] = (r % 2 ? 1 : -1) * 1e-37 * std::exp2(-double(r % 24));
      }
      const QuantizeConfig cfg{b, f, Rounding::kNearest, 0};
      Quantized qd = QuantizeRef(x, rows, cols, cfg);
      for (float sc : qd.scales) {
        EXPECT_TRUE(std::isfinite(1.0f / sc)) << "scale " << sc;
      }
      const std::vector<double> back = Dequant(qd, rows, cols, cfg);
      for (int64_t i = 0; i < rows * cols; ++i) {
        ASSERT_TRUE(std::isfinite(back[i])) << "element " << i << " of " << x[i];
        // Bounded by the largest value of the rows element i's block spans
        // (all columns: an upper bound of the block's amax).
        const int64_t block_rows = b == ScaleBlock::k1x128 ? 1 : (b == ScaleBlock::k32x32 ? 32 : 128);
        const int64_t r0 = (i / cols) / block_rows * block_rows;
        double amax = 0;
        for (int64_t r = r0; r < std::min(rows, r0 + block_rows); ++r) {
          for (int64_t j = 0; j < cols; ++j) amax = std::max(amax, std::fabs(x[r * cols + j]));
        }
        // Plus half the format's smallest step at the smallest scale,
        // 2^-126: a block far below it only uses less of the format.
        EXPECT_LE(std::fabs(back[i] - x[i]), 0.125 * amax + std::ldexp(1.0, -136))
            << "element " << i;
      }
    }
  }
}

TEST(QuantizeTest, SquareBlocksAreIdenticalForTheTranspose) {
  const int64_t rows = 70, cols = 150;
  std::vector<double> x = WideRange(rows * cols);
  for (ScaleBlock block : {ScaleBlock::k32x32, ScaleBlock::k128x128}) {
    QuantizeConfig cfg{block, DType::kFloat8E4M3, Rounding::kNearest, 0};
    Quantized a = QuantizeRef(x, rows, cols, cfg), t = QuantizeRef(x, rows, cols, cfg, true);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) ASSERT_EQ(a.q[i * cols + j], t.q[j * rows + i]);
    }
    for (int64_t i = 0; i < a.scale_shape[0]; ++i) {
      for (int64_t j = 0; j < a.scale_shape[1]; ++j) {
        ASSERT_EQ(a.scales[i * a.scale_shape[1] + j], t.scales[j * t.scale_shape[1] + i]);
      }
    }
  }
}

TEST(QuantizeTest, StochasticRoundingIsUnbiasedAndStaysBetweenNeighbours) {
  const int64_t rows = 2, cols = 256, draws = 4000;
  std::vector<double> x = RandomDoubles(rows * cols, -1, 1);
  for (DType f : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    std::vector<double> sum(rows * cols, 0.0);
    QuantizeConfig near{ScaleBlock::k1x128, f, Rounding::kNearest, 0};
    Quantized qn = QuantizeRef(x, rows, cols, near);
    std::vector<double> rn = Dequant(qn, rows, cols, near);
    const uint64_t base = TestRng()();
    for (int64_t d = 0; d < draws; ++d) {
      QuantizeConfig cfg{ScaleBlock::k1x128, f, Rounding::kStochastic, base + d};
      Quantized qd = QuantizeRef(x, rows, cols, cfg);
      std::vector<double> y = Dequant(qd, rows, cols, cfg);
      for (int64_t i = 0; i < rows * cols; ++i) {
        // One of the two representable neighbours: within one ulp of x.
        ASSERT_LE(std::fabs(y[i] - x[i]), 2 * std::fabs(rn[i] - x[i]) + std::fabs(x[i]) * 0.25 + 1e-3);
        sum[i] += y[i];
      }
    }
    const int man = f == DType::kFloat8E4M3 ? 3 : 2;
    double max_z = 0, mean_bias = 0;
    for (int64_t i = 0; i < rows * cols; ++i) {
      const double mean = sum[i] / draws;
      // Bernoulli between neighbours one ulp apart: sd <= ulp / 2 / sqrt(draws).
      const double ulp = std::max(std::fabs(x[i]) * std::ldexp(1.0, -man),
                                  qn.scales[i / cols] * std::ldexp(1.0, (man == 3 ? -9 : -16)));
      max_z = std::max(max_z, std::fabs(mean - x[i]) / (ulp / 2 / std::sqrt(double(draws))));
      mean_bias += (mean - x[i]) / ulp;
    }
    EXPECT_LT(max_z, 5.5) << DTypeName(f);  // 512 elements: 5.5 sigma is a 1e-6 event
    EXPECT_LT(std::fabs(mean_bias / (rows * cols)), 0.01) << DTypeName(f);
    // Nearest rounding, by contrast, is biased for most elements.
  }
}

// The snap behind stochastic rounding, value by value: normals (where the
// random bits are added under the kept mantissa), subnormals (fixed
// spacing), a value one step below a power of two (the carry moves into the
// exponent), saturation, infinities, NaN and signed zero.
TEST(StochasticSnapTest, PicksNeighboursWithTheRightOddsAndHandlesSpecials) {
  using minifloat::StochasticSnap;
  const uint32_t key = minifloat::RandomKey(TestRng()());
  for (const minifloat::Spec s : {minifloat::E4M3(), minifloat::E5M2()}) {
    const int man = s.man_bits, min_exp = 1 - s.bias;
    const float sub = std::ldexp(1.0f, min_exp - man);  // subnormal spacing
    struct Case {
      float x, lo, hi;
    };
    const float step = std::ldexp(1.0f, 2 - man);  // spacing in [4, 8)
    const std::vector<Case> cases = {
        {1.3f, 1.25f, man == 3 ? 1.375f : 1.5f},
        {-0.3f, -0.3125f, man == 3 ? -0.28125f : -0.25f},
        {8.0f - 0.75f * step, 8.0f - step, 8.0f},  // carry into the exponent
        {2.7f * sub, 2 * sub, 3 * sub},
        {0.1f * sub, 0.0f, sub},
        {std::ldexp(1.0f, min_exp) - 0.5f * sub, std::ldexp(1.0f, min_exp) - sub,
         std::ldexp(1.0f, min_exp)},
    };
    for (const Case& c : cases) {
      const int n = 20000;
      int up = 0;
      for (int i = 0; i < n; ++i) {
        const float y = StochasticSnap(s, c.x, minifloat::RandomBits(key, i));
        ASSERT_TRUE(y == c.lo || y == c.hi) << c.x << " -> " << y;
        // Exactly representable: encoding and decoding gives it back.
        ASSERT_EQ(minifloat::Decode(s, minifloat::Encode(s, y)), y);
        up += y == c.hi;
      }
      const double p = (c.x - c.lo) / (c.hi - c.lo);
      const double sd = std::sqrt(p * (1 - p) / n);
      EXPECT_NEAR(static_cast<double>(up) / n, p, 5 * sd + 1e-4) << c.x;
    }
    const float fmax = minifloat::MaxFinite(s);
    EXPECT_EQ(minifloat::Decode(s, s.max_code), fmax);
    for (uint32_t r : {0u, 0xFFFFFFFFu, 0x12345678u}) {
      EXPECT_EQ(StochasticSnap(s, fmax, r), fmax);
      EXPECT_EQ(StochasticSnap(s, 1.5f * fmax, r), fmax);
      EXPECT_EQ(StochasticSnap(s, -INFINITY, r), -fmax);
      EXPECT_TRUE(std::isnan(StochasticSnap(s, NAN, r)));
      EXPECT_EQ(minifloat::EncodeStochastic(s, NAN, r), minifloat::kNaNCode);
      EXPECT_EQ(minifloat::EncodeStochastic(s, -0.0f, r), 0x80);
      EXPECT_EQ(StochasticSnap(s, 0.0f, r), 0.0f);
    }
  }
}

// The kernels' fast path for finite normal values must give the same bits
// as the full snap (the GPU tests compare against the CPU reference, which
// takes the full one).
TEST(StochasticSnapTest, NormalFastPathAgreesWithTheFullSnap) {
  const uint32_t key = minifloat::RandomKey(TestRng()());
  const std::vector<double> m = RandomDoubles(4096, -1, 1), e = RandomDoubles(4096, -6, 17);
  for (const minifloat::Spec s : {minifloat::E4M3(), minifloat::E5M2()}) {
    const float min_normal = std::ldexp(1.0f, 1 - s.bias), fmax = minifloat::MaxFinite(s);
    int checked = 0;
    for (size_t i = 0; i < m.size(); ++i) {
      float x = static_cast<float>(m[i] * std::exp2(e[i]) * (s.man_bits == 3 ? 1 : 128));
      if (i % 64 == 0) x = (i % 128 == 0 ? 1 : -1) * (fmax * (1 + 0.01f * (i % 7)));  // saturation
      if (std::fabs(x) < min_normal) continue;
      const uint32_t r = minifloat::RandomBits(key, i);
      ASSERT_EQ(minifloat::StochasticSnapNormal(s, x, r), minifloat::StochasticSnap(s, x, r)) << x;
      // Without the clamp the value may pass MaxFinite, the code may not.
      ASSERT_EQ(minifloat::Encode(s, minifloat::StochasticSnapNormalUnclamped(s, x, r)),
                minifloat::EncodeStochastic(s, x, r))
          << x;
      ++checked;
    }
    EXPECT_GT(checked, 3000);
  }
}

// The bit-level power-of-two scale agrees with the frexp/ldexp definition
// (p = e - 1 if m == 0.5 else e, clamped to [-127, 127]) on normals,
// subnormals, exact powers of two and the ends of the range.
TEST(BlockScaleTest, Pow2AtLeastMatchesFrexpDefinition) {
  auto reference = [](float r) {
    int e;
    const float m = std::frexp(r, &e);
    int p = m == 0.5f ? e - 1 : e;
    p = std::clamp(p, -127, 127);
    return std::ldexp(1.0f, p);
  };
  std::vector<float> rs = {0.0f, std::numeric_limits<float>::denorm_min(),
                           std::ldexp(1.0f, -127), std::nextafter(std::ldexp(1.0f, -127), 1.0f),
                           std::ldexp(1.0f, -126), std::numeric_limits<float>::min() * 0.75f,
                           1.0f, 1.5f, 448.0f, std::ldexp(1.0f, 127),
                           std::nextafter(std::ldexp(1.0f, 127), INFINITY),
                           std::numeric_limits<float>::max()};
  const std::vector<double> m = RandomDoubles(20000, 0.5, 1), e = RandomDoubles(20000, -152, 128);
  for (size_t i = 0; i < m.size(); ++i) {
    rs.push_back(static_cast<float>(std::ldexp(m[i], static_cast<int>(std::floor(e[i])))));
  }
  for (float r : rs) ASSERT_EQ(minifloat::Pow2AtLeast(r), reference(r)) << r;
}

TEST(StochasticSnapTest, RandomBitsAreBalancedAndDependOnSeedAndIndex) {
  const uint64_t seed = TestRng()();
  const uint32_t key = minifloat::RandomKey(seed);
  EXPECT_NE(key, minifloat::RandomKey(seed + 1));
  EXPECT_NE(key, minifloat::RandomKey(seed ^ (uint64_t{1} << 40)));
  const int n = 1 << 16;
  std::vector<int> ones(32, 0);
  for (int i = 0; i < n; ++i) {
    const uint32_t r = minifloat::RandomBits(key, i);
    ASSERT_EQ(r & 0xFFFFu, 0u) << i;  // 16 random bits, at the top
    for (int b = 16; b < 32; ++b) ones[b] += (r >> b) & 1;
  }
  for (int b = 16; b < 32; ++b) {
    EXPECT_NEAR(ones[b], n / 2, 5 * std::sqrt(n / 4.0)) << "bit " << b;  // 5 sigma
  }
  // The two elements of a pair take different halves of one hash, and
  // neighbouring pairs differ.
  const uint32_t h = minifloat::PairHash(key, 21);
  EXPECT_EQ(minifloat::RandomBits(key, 42), h & 0xFFFF0000u);
  EXPECT_EQ(minifloat::RandomBits(key, 43), h << 16);
  EXPECT_NE(minifloat::PairHash(key, 21), minifloat::PairHash(key, 22));
  // Indices past 2^32 draw other bits than their low 32 bits.
  EXPECT_NE(minifloat::RandomBits(key, 7), minifloat::RandomBits(key, (uint64_t{1} << 32) + 7));
}

TEST(HadamardTest, InvertibleOrthonormalAndPreservesProducts) {
  const int64_t rows = 3, cols = 256;
  const uint64_t seed = TestRng()();
  for (int64_t block : {2, 16, 128, 256}) {
    std::vector<double> x = RandomDoubles(rows * cols), w = RandomDoubles(rows * cols);
    std::vector<double> hx(rows * cols), hw(rows * cols), back(rows * cols);
    auto v = [&](std::vector<double>& d) { return MakeView(d.data(), DType::kFloat64, {rows, cols}); };
    ASSERT_TRUE(RandomHadamard(v(x), block, seed, false, v(hx)).ok());
    ASSERT_TRUE(RandomHadamard(v(w), block, seed, false, v(hw)).ok());
    ASSERT_TRUE(RandomHadamard(v(hx), block, seed, true, v(back)).ok());
    for (int64_t i = 0; i < rows * cols; ++i) ASSERT_NEAR(back[i], x[i], 1e-13);
    for (int64_t r = 0; r < rows; ++r) {
      double xw = 0, hxhw = 0;
      for (int64_t j = 0; j < cols; ++j) {
        xw += x[r * cols + j] * w[r * cols + j];
        hxhw += hx[r * cols + j] * hw[r * cols + j];
      }
      EXPECT_NEAR(xw, hxhw, 1e-12);
    }
  }
  std::vector<double> x(12);
  EXPECT_FALSE(RandomHadamard(MakeView(x.data(), DType::kFloat64, {2, 6}), 4, seed, false,
                              MakeView(x.data(), DType::kFloat64, {2, 6}))
                   .ok());
}

TEST(HadamardTest, SpreadsAnOutlier) {
  const int64_t cols = 128;
  std::vector<double> x = RandomDoubles(cols, -0.01, 0.01), y(cols);
  x[17] = 100;
  ASSERT_TRUE(RandomHadamard(MakeView(x.data(), DType::kFloat64, {1, cols}), cols, 7, false,
                             MakeView(y.data(), DType::kFloat64, {1, cols}))
                  .ok());
  double amax = 0;
  for (double v : y) amax = std::max(amax, std::fabs(v));
  EXPECT_LT(amax, 100 / std::sqrt(128.0) + 0.2);
}

TEST(PackTest, PackUnpackRoundTripAndQuantizeAndPackAgree) {
  const int64_t rows = 40, cols = 70;
  for (ScaleBlock block : {ScaleBlock::k1x128, ScaleBlock::k128x128, ScaleBlock::k32x32}) {
    std::vector<double> x = WideRange(rows * cols);
    QuantizeConfig cfg{block, DType::kFloat8E4M3, Rounding::kNearest, 0};
    Quantized qd = QuantizeRef(x, rows, cols, cfg);
    const size_t bytes = PackedBytes(rows, cols, block);
    std::vector<uint64_t> a(bytes / 8 + 2), b(bytes / 8 + 2);
    ASSERT_EQ(bytes % 16, 0u);
    ASSERT_TRUE(PackQuantized(MakeView(qd.q.data(), cfg.format, {rows, cols}),
                              MakeView(qd.scales.data(), DType::kFloat32, qd.scale_shape), block,
                              a.data())
                    .ok());
    ASSERT_TRUE(QuantizeAndPack(MakeView(x.data(), DType::kFloat64, {rows, cols}), cfg, b.data())
                    .ok());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), bytes), 0) << ScaleBlockName(block);
    Quantized back;
    back.q.resize(rows * cols);
    back.scales.resize(qd.scales.size());
    ASSERT_TRUE(UnpackQuantized(a.data(), block, MakeView(back.q.data(), cfg.format, {rows, cols}),
                                MakeView(back.scales.data(), DType::kFloat32, qd.scale_shape))
                    .ok());
    EXPECT_EQ(back.q, qd.q);
    EXPECT_EQ(back.scales, qd.scales);
  }
}

// Matrices of odd shapes (partial edge tiles in both directions), one flat
// buffer, cut into holders' ranges as an FSDP shard cuts them.
struct TiledSetup : TiledMatrices {
  std::vector<float> w;
  TiledSetup() : TiledMatrices({{300, 250}, {129, 17}, {5, 1000}, {1, 1}}) {
    const std::vector<double> x = WideRange(numel);
    w.assign(x.begin(), x.end());
    // Matrix 1's second tile (its last row) all zero.
    for (int64_t i = 0; i < 17; ++i) w[offsets[1] + 128 * 17 + i] = 0.0f;
  }
};

TEST(TiledPieceTest, PiecesCutAnywhereCarryTheWholeMatricesQuantization) {
  const TiledSetup t;
  const std::vector<int64_t> cuts = {0, 1, 127, 128 * 250 + 3, 40'500, 74'999, 75'001, 77'000, t.numel};
  // Every holder takes the amax of its pieces; the holders reduce them.
  std::vector<float> amax(t.tiles, 0.0f);
  for (size_t h = 0; h + 1 < cuts.size(); ++h) {
    std::vector<float> own(t.tiles, 0.0f);
    for (const auto& [at, piece] : t.PiecesOf(cuts[h], cuts[h + 1])) {
      ASSERT_TRUE(TiledPieceAmax(MakeView(const_cast<float*>(t.w.data()) + at, DType::kFloat32, {piece.numel}), piece,
                                 MakeView(own.data(), DType::kFloat32, {t.tiles}))
                      .ok());
    }
    for (int64_t i = 0; i < t.tiles; ++i) amax[i] = std::max(amax[i], own[i]);
  }
  std::vector<float> scales(t.tiles);
  ASSERT_TRUE(TileScalesFromAmax(MakeView(amax.data(), DType::kFloat32, {t.tiles}), DType::kFloat8E4M3,
                                 MakeView(scales.data(), DType::kFloat32, {t.tiles}))
                  .ok());
  std::vector<uint8_t> q(t.numel);
  std::vector<float> back(t.numel);
  for (size_t h = 0; h + 1 < cuts.size(); ++h) {
    for (const auto& [at, piece] : t.PiecesOf(cuts[h], cuts[h + 1])) {
      const TensorView sv = MakeView(scales.data(), DType::kFloat32, {t.tiles});
      const TensorView qv = MakeView(q.data() + at, DType::kFloat8E4M3, {piece.numel});
      ASSERT_TRUE(QuantizeTiledPiece(MakeView(const_cast<float*>(t.w.data()) + at, DType::kFloat32, {piece.numel}),
                                     piece, sv, qv)
                      .ok());
      ASSERT_TRUE(DequantizeTiledPiece(qv, piece, sv, MakeView(back.data() + at, DType::kFloat32, {piece.numel})).ok());
    }
  }
  const QuantizeConfig cfg{ScaleBlock::k128x128, DType::kFloat8E4M3, Rounding::kNearest, 0};
  for (size_t m = 0; m < t.shapes.size(); ++m) {
    const auto [rows, cols] = t.shapes[m];
    std::vector<double> x(t.w.begin() + t.offsets[m], t.w.begin() + t.offsets[m] + rows * cols);
    Quantized whole = QuantizeRef(x, rows, cols, cfg);
    const std::vector<double> dq = Dequant(whole, rows, cols, cfg);
    for (int64_t k = 0; k < TileCount(rows, cols); ++k) {
      ASSERT_EQ(scales[t.first_tiles[m] + k], whole.scales[k]) << "matrix " << m << " tile " << k;
    }
    for (int64_t i = 0; i < rows * cols; ++i) {
      ASSERT_EQ(q[t.offsets[m] + i], whole.q[i]) << "matrix " << m << " element " << i;
      ASSERT_EQ(back[t.offsets[m] + i], static_cast<float>(dq[i])) << "matrix " << m << " element " << i;
    }
  }
  EXPECT_EQ(scales[t.first_tiles[1] + 1], 1.0f);  // The all-zero tile.
  // A piece reaching past the tile array is refused.
  std::vector<float> few(2);
  EXPECT_EQ(TiledPieceAmax(MakeView(const_cast<float*>(t.w.data()), DType::kFloat32, {300 * 250}),
                           TiledPiece{300 * 250, 0, 250, 0}, MakeView(few.data(), DType::kFloat32, {2}))
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// What the FP8 GEMM does with a dequantized 128x128 copy (the FP8
// all-gather's output): quantizing it again gives the same codes, and
// scales equal to within the fp32 rounding of amax / 448.
TEST(TiledPieceTest, RequantizingADequantizedWeightKeepsItsCodes) {
  const int64_t rows = 300, cols = 250;
  const QuantizeConfig cfg{ScaleBlock::k128x128, DType::kFloat8E4M3, Rounding::kNearest, 0};
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<double> x = WideRange(rows * cols);
    Quantized first = QuantizeRef(x, rows, cols, cfg);
    std::vector<double> copy = Dequant(first, rows, cols, cfg);
    for (double& v : copy) v = static_cast<float>(v);  // the fp32 copy
    Quantized again = QuantizeRef(copy, rows, cols, cfg);
    ASSERT_EQ(again.q, first.q) << "trial " << trial;
    for (size_t k = 0; k < first.scales.size(); ++k) {
      EXPECT_NEAR(again.scales[k], first.scales[k], std::ldexp(first.scales[k], -22)) << "tile " << k;
    }
  }
}

}  // namespace
}  // namespace recfleet
