#ifndef RECFLEET_DATA_BALANCE_H_
#define RECFLEET_DATA_BALANCE_H_

// The balance report: the per-step straggler gap (max rank cost / mean - 1)
// of each dealing policy over the windows of an epoch, and the lower bound
// no dealing can beat. Backs `recfleet data balance-report` and
// bench/data. Pure functions.

#include <cstdint>
#include <string>
#include <vector>

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

// Deals every window (the sample lengths of one step, in dealing order) with
// every policy; windows of other than options.WindowSize() samples are left
// out (a short last window's ranks differ in size). Rows: naive,
// sort-interleave, recfleet, recfleet with consecutive base batches, and
// the lower bound. For a dataset file, take the windows from the loader
// (data::EpochWindows) so the report sees exactly what the loader deals.
std::vector<BalanceRow> BalanceOfWindows(const std::vector<std::vector<int64_t>>& windows,
                                         const CostModel& cost, const DealOptions& options);

// For a length distribution without a file (independent samples): for each
// of `epochs` epochs shuffles `lengths` (seeded by seed and the epoch), cuts
// it into windows and reports BalanceOfWindows over all of them.
std::vector<BalanceRow> ComputeBalance(const std::vector<int64_t>& lengths, const CostModel& cost,
                                       const DealOptions& options, uint64_t seed, int epochs = 1);

// A fixed-width table of the rows (gaps in percent).
std::string FormatBalance(const std::vector<BalanceRow>& rows);

}  // namespace recfleet::data

#endif  // RECFLEET_DATA_BALANCE_H_
