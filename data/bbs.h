#ifndef RECFLEET_DATA_BBS_H_
#define RECFLEET_DATA_BBS_H_

// Base Batch Shuffling: dealing one step's window of samples to R ranks so
// that every rank's batch costs about the same (the step waits for the
// slowest rank). A full window holds R x K base batches of B samples.
//
// Policies:
//  - kNaive: rank r takes the r-th consecutive slice of the window.
//  - kSortInterleave: Meta's BBS. Consecutive runs of B samples form base
//    batches; they are sorted by cost and dealt in serpentine order
//    (0..R-1, R-1..0, ...), pairing heavy with light.
//  - kRecfleet: a cardinality-constrained greedy partition (largest cost
//    first, to the cheapest rank that still has room) refined by pairwise
//    swaps between the most expensive rank and the others. With
//    length-aware base batches (the default) it partitions samples, not
//    fixed base batches, then splits each rank's samples into base
//    batches of equal cost the same way, so any micro-batch made of whole
//    base batches is even too. Every sample of the window is dealt exactly
//    once under every policy.
//
// Pure functions; thread-compatible.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recfleet::data {

enum class Policy { kNaive, kSortInterleave, kRecfleet };

absl::string_view PolicyName(Policy p);
absl::StatusOr<Policy> ParsePolicy(absl::string_view name);  // naive|sort-interleave|recfleet

struct DealOptions {
  int ranks = 8;
  int base_batch = 128;
  int base_batches_per_rank = 8;  // K: a rank's batch is K * base_batch samples.
  // kRecfleet: form base batches from the window's samples by cost (true)
  // or deal the consecutive base batches as units (false).
  bool length_aware_base_batches = true;
  // A worker's micro-batch is this many consecutive base batches; each
  // rank's base batches are ordered so its micro-batches cost the same.
  int micro_batch_base_batches = 1;
  // Bound on swap-refinement rounds per partition.
  int max_swap_rounds = 256;

  int WindowSize() const { return ranks * base_batches_per_rank * base_batch; }
};

// One window dealt: ranks[r][j] lists window-local sample indices of rank
// r's j-th base batch, in order.
struct Deal {
  std::vector<std::vector<std::vector<uint32_t>>> ranks;
  std::vector<double> rank_cost;

  // Straggler gap: max rank cost / mean rank cost - 1 (0 when all equal).
  double Gap() const;
};

// Deals samples 0..costs.size()-1 (costs.size() <= options.WindowSize();
// a short last window gives ranks sizes differing by at most one sample).
Deal DealWindow(Policy policy, const std::vector<double>& costs, const DealOptions& options);

// Splits `items` into groups of the given sizes (summing to items.size())
// with loads as even as the greedy-plus-swaps search finds. Exposed for
// tests; returns the groups' item lists.
std::vector<std::vector<uint32_t>> BalancedPartition(const std::vector<double>& costs,
                                                     const std::vector<uint32_t>& items,
                                                     const std::vector<size_t>& sizes,
                                                     int max_swap_rounds);

// A lower bound on the gap of any dealing into `ranks` equal-size ranks: the rank
// holding the most expensive sample carries it plus at least its other
// sizes-1 cheapest samples.
double GapLowerBound(const std::vector<double>& costs, int ranks);

}  // namespace recfleet::data

#endif  // RECFLEET_DATA_BBS_H_
