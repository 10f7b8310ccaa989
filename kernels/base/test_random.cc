#include "kernels/base/test_random.h"

#include <cstdio>
#include <cstdlib>

namespace recfleet {

std::mt19937_64& TestRng() {
  static std::mt19937_64* rng = [] {
    const char* env = std::getenv("RECFLEET_TEST_SEED");
    const uint64_t seed = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("test seed %llu (replay with RECFLEET_TEST_SEED)\n",
                static_cast<unsigned long long>(seed));
    return new std::mt19937_64(seed);
  }();
  return *rng;
}

std::vector<double> RandomDoubles(int64_t n, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = u(TestRng());
  return v;
}

}  // namespace recfleet
