#include "worker/batch_plan.h"

#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

namespace recfleet::worker {
namespace {

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [0, n) without modulo bias (Lemire's rejection).
uint64_t Below(uint64_t n, uint64_t* state) {
  const uint64_t limit = -n % n;  // 2^64 mod n.
  while (true) {
    const uint64_t x = SplitMix64(state);
    const unsigned __int128 m = static_cast<unsigned __int128>(x) * n;
    if (static_cast<uint64_t>(m) >= limit) return static_cast<uint64_t>(m >> 64);
  }
}

}  // namespace

absl::StatusOr<BatchPlan> BatchPlan::Create(int64_t num_samples, int world_size, int64_t local_batch,
                                            uint64_t seed) {
  if (world_size < 1 || local_batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size and local_batch must be >= 1, got ", world_size, " and ", local_batch));
  }
  if (num_samples < world_size * local_batch) {
    return absl::InvalidArgumentError(absl::StrCat("the dataset has ", num_samples, " training samples, fewer than one ",
                                                   "step needs (", world_size, " ranks x ", local_batch, ")"));
  }
  return BatchPlan(num_samples, world_size, local_batch, seed);
}

std::vector<int64_t> BatchPlan::EpochPermutation(int64_t num_samples, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(num_samples);
  std::iota(perm.begin(), perm.end(), 0);
  uint64_t state = seed * 0x2545f4914f6cdd1dULL + static_cast<uint64_t>(epoch) + 1;
  for (int64_t i = num_samples - 1; i > 0; --i) {
    std::swap(perm[i], perm[Below(static_cast<uint64_t>(i) + 1, &state)]);
  }
  return perm;
}

std::vector<int64_t> BatchPlan::Rows(int64_t step, int rank) const {
  const int64_t epoch = (step - 1) / steps_per_epoch_;
  const int64_t in_epoch = (step - 1) % steps_per_epoch_;
  // The permutation is rebuilt per call: O(N) for datasets this path serves
  // (the data-loader serves large ones), cheap next to a training step.
  const std::vector<int64_t> perm = EpochPermutation(num_samples_, seed_, epoch);
  const int64_t begin = (in_epoch * world_size_ + rank) * local_batch_;
  return std::vector<int64_t>(perm.begin() + begin, perm.begin() + begin + local_batch_);
}

}  // namespace recfleet::worker
