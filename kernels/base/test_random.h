#ifndef RECFLEET_KERNELS_BASE_TEST_RANDOM_H_
#define RECFLEET_KERNELS_BASE_TEST_RANDOM_H_

// Fresh random test data for the kernel tests. The generator is seeded from
// std::random_device once per process (or from RECFLEET_TEST_SEED when set)
// and prints its seed, so every run sees new data and any failure can be
// replayed.

#include <cstdint>
#include <random>
#include <vector>

namespace recfleet {

std::mt19937_64& TestRng();

// n values uniform in [lo, hi).
std::vector<double> RandomDoubles(int64_t n, double lo = -1.0, double hi = 1.0);

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_BASE_TEST_RANDOM_H_
