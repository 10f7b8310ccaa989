// The GEMM's elementwise helpers (gemm_kernels.h) against a float64 host
// reference on fresh random data: the bias add for every (c, bias) dtype
// pair and the bias-gradient column sums, overwriting (into a poisoned
// output) and accumulating, on ragged shapes around the launch edges.

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/device_buffer.h"
#include "kernels/base/formats.h"
#include "kernels/base/test_random.h"
#include "kernels/gemm/gemm_kernels.h"

namespace recfleet {
namespace {

constexpr int kF32 = 0, kBf16 = 1;

// Host values of one element type: random in [-1, 1), rounded to bf16 when
// asked, kept as float64 for the reference and as device bytes.
struct HostTensor {
  int type;
  std::vector<double> values;
  std::vector<float> f32;
  std::vector<uint16_t> b16;

  HostTensor(int t, int64_t n) : type(t), values(RandomDoubles(n)) {
    for (double& v : values) {
      if (type == kBf16) {
        b16.push_back(FloatToBFloat16(static_cast<float>(v)));
        v = BFloat16ToFloat(b16.back());
      } else {
        f32.push_back(static_cast<float>(v));
        v = f32.back();
      }
    }
  }
  DeviceBuffer ToDevice() const { return type == kBf16 ? DeviceBuffer(b16) : DeviceBuffer(f32); }
};

std::vector<double> Read(const DeviceBuffer& d, int type) {
  std::vector<double> out;
  if (type == kBf16) {
    for (uint16_t b : d.ToHost<uint16_t>()) out.push_back(BFloat16ToFloat(b));
  } else {
    for (float f : d.ToHost<float>()) out.push_back(f);
  }
  return out;
}

// `offset` elements before c in its allocation: an offset of 1 leaves c
// off the 16-byte alignment of the vectorized kernel.
void CheckAddBias(int64_t m, int64_t n, int c_type, int bias_type, int64_t offset = 0) {
  SCOPED_TRACE(::testing::Message() << "AddBias m=" << m << " n=" << n << " c=" << c_type
                                    << " bias=" << bias_type << " offset=" << offset);
  HostTensor c(c_type, offset + m * n), bias(bias_type, n);
  DeviceBuffer dc = c.ToDevice(), dbias = bias.ToDevice();
  const int64_t es = c_type == kBf16 ? 2 : 4;
  ASSERT_EQ(gemm_cuda::AddBias(static_cast<char*>(dc.get()) + offset * es, c_type, dbias.get(),
                               bias_type, m, n, nullptr),
            cudaSuccess);
  const std::vector<double> got = Read(dc, c_type);
  for (int64_t i = 0; i < offset; ++i) ASSERT_EQ(got[i], c.values[i]) << "before c";
  // The kernel adds in fp32 and rounds once to c's type.
  const double tol = c_type == kBf16 ? 8e-3 : 1e-6;
  for (int64_t i = 0; i < m * n; ++i) {
    const double want = c.values[offset + i] + bias.values[i % n];
    ASSERT_NEAR(got[offset + i], want, tol * (1 + std::fabs(want))) << "element " << i;
  }
}

TEST(GemmKernelsCudaTest, AddBiasMatchesFloat64Reference) {
  // Widths that are and are not multiples of the 16-byte packs (4 fp32,
  // 8 bf16 elements), around the launch edges.
  const int64_t shapes[][2] = {{1, 1},     {3, 1},      {7, 5},       {1000, 1},   {257, 33},
                               {3, 16},    {999, 8},    {1024, 256},  {4097, 1023},
                               {65537, 4}, {70001, 129}, {20001, 768}};
  for (const auto& s : shapes) {
    for (int c : {kF32, kBf16}) {
      for (int b : {kF32, kBf16}) {
        CheckAddBias(s[0], s[1], c, b);
        CheckAddBias(s[0], s[1], c, b, /*offset=*/1);
      }
    }
  }
}

void CheckColumnSums(int64_t m, int64_t n, int dy_type, int out_type, bool accumulate) {
  SCOPED_TRACE(::testing::Message() << "ColumnSums m=" << m << " n=" << n << " dy=" << dy_type
                                    << " out=" << out_type << " accumulate=" << accumulate);
  HostTensor dy(dy_type, m * n), start(out_type, n);
  DeviceBuffer ddy = dy.ToDevice(), dout = start.ToDevice();
  if (!accumulate) {
    // Poison: an overwriting sum must not read what was there.
    if (out_type == kBf16) {
      ASSERT_EQ(cudaMemset(dout.get(), 0xff, n * 2), cudaSuccess);  // bf16 NaN
    } else {
      const std::vector<float> nan(n, std::numeric_limits<float>::quiet_NaN());
      ASSERT_EQ(cudaMemcpy(dout.get(), nan.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ASSERT_EQ(gemm_cuda::ColumnSums(ddy.get(), dy_type, m, n, accumulate, dout.get(), out_type,
                                  nullptr),
            cudaSuccess);
  const std::vector<double> got = Read(dout, out_type);
  for (int64_t j = 0; j < n; ++j) {
    double want = accumulate ? start.values[j] : 0.0, mag = accumulate ? std::fabs(want) : 0.0;
    for (int64_t i = 0; i < m; ++i) {
      want += dy.values[i * n + j];
      mag += std::fabs(dy.values[i * n + j]);
    }
    // fp32 accumulation of m terms; one final rounding to bf16 for bf16 out.
    const double tol = 1e-6 * mag + 1e-6 + (out_type == kBf16 ? 8e-3 * std::fabs(want) : 0.0);
    ASSERT_NEAR(got[j], want, tol) << "column " << j;
  }
}

TEST(GemmKernelsCudaTest, ColumnSumsMatchFloat64Reference) {
  const int64_t shapes[][2] = {{1, 1}, {1, 300}, {5, 3}, {255, 1}, {256, 31}, {257, 33},
                               {1024, 1}, {1024, 256}, {3001, 1025}, {78001, 4}, {12345, 256}};
  for (const auto& s : shapes) {
    for (bool acc : {false, true}) {
      CheckColumnSums(s[0], s[1], kF32, kF32, acc);
      CheckColumnSums(s[0], s[1], kBf16, kF32, acc);
      CheckColumnSums(s[0], s[1], kBf16, kBf16, acc);
    }
  }
}

// Same inputs, same bits: the sums run in a fixed order.
TEST(GemmKernelsCudaTest, ColumnSumsAreDeterministic) {
  const int64_t m = 20000, n = 96;
  HostTensor dy(kF32, m * n);
  DeviceBuffer ddy = dy.ToDevice(), a(n * 4), b(n * 4);
  ASSERT_EQ(gemm_cuda::ColumnSums(ddy.get(), kF32, m, n, false, a.get(), kF32, nullptr),
            cudaSuccess);
  ASSERT_EQ(gemm_cuda::ColumnSums(ddy.get(), kF32, m, n, false, b.get(), kF32, nullptr),
            cudaSuccess);
  EXPECT_EQ(a.ToHost<uint32_t>(), b.ToHost<uint32_t>());
}

}  // namespace
}  // namespace recfleet
