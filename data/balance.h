#ifndef RECFLEET_DATA_BALANCE_H_
#define RECFLEET_DATA_BALANCE_H_

// The balance report: the per-step straggler gap (max rank cost / mean - 1)
// of each dealing policy over one epoch of a length distribution, and the
// lower bound no dealing can beat. Backs `recfleet data balance-report`
// and bench/data. Pure functions.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/bbs.h"
#include "data/cost_model.h"

namespace recfleet::data {

struct GapStats {
  size_t steps = 0;
  double mean = 0, p50 = 0, p99 = 0, max = 0;
};

// Nearest-rank percentiles of `gaps`.
GapStats Summarize(std::vector<double> gaps);

struct BalanceRow {
  std::string policy;
  GapStats gap;
};

// For each of `epochs` epochs: shuffles `lengths` (seeded by seed and the
// epoch), cuts it into full windows of options.WindowSize() samples (the
// short last window is left out: its ranks differ in size) and deals each
// window with every policy. Steps of all epochs are pooled.
// Rows: naive, sort-interleave, recfleet, recfleet with consecutive base
// batches, and the lower bound.
std::vector<BalanceRow> ComputeBalance(const std::vector<int64_t>& lengths, const CostModel& cost,
                                       const DealOptions& options, uint64_t seed, int epochs = 1);

// A fixed-width table of the rows (gaps in percent).
std::string FormatBalance(const std::vector<BalanceRow>& rows);

// The length of jagged feature `feature` for every row of `files`, read
// with the streaming reader (memory: 8 bytes per row).
absl::StatusOr<std::vector<int64_t>> ReadLengths(const std::vector<std::string>& files,
                                                 const std::string& feature);

}  // namespace recfleet::data

#endif  // RECFLEET_DATA_BALANCE_H_
