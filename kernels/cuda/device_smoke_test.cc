#include "kernels/cuda/device_smoke.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace recfleet::cuda {
namespace {

TEST(DeviceSmokeTest, SaxpyMatchesHost) {
  std::printf("device: %s\n", DescribeDevice().c_str());
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int n = 1 << 20;
  std::vector<float> x(n), y(n), want(n);
  for (int i = 0; i < n; ++i) {
    x[i] = u(rng);
    y[i] = u(rng);
    // nvcc contracts a * x + y into one fused multiply-add.
    want[i] = std::fma(2.5f, x[i], y[i]);
  }
  ASSERT_EQ(Saxpy(2.5f, x.data(), y.data(), n), "");
  for (int i = 0; i < n; ++i) ASSERT_EQ(y[i], want[i]) << "at " << i;
}

}  // namespace
}  // namespace recfleet::cuda
