#include "data/balance.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"

namespace recfleet::data {

GapStats Summarize(std::vector<double> gaps) {
  GapStats s;
  s.steps = gaps.size();
  if (gaps.empty()) return s;
  std::sort(gaps.begin(), gaps.end());
  auto pct = [&](double p) {
    size_t rank = static_cast<size_t>(std::ceil(p * gaps.size()));
    return gaps[std::min(gaps.size() - 1, rank == 0 ? 0 : rank - 1)];
  };
  s.mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / gaps.size();
  s.p50 = pct(0.50);
  s.p99 = pct(0.99);
  s.max = gaps.back();
  return s;
}

std::vector<BalanceRow> BalanceOfWindows(const std::vector<std::vector<int64_t>>& windows,
                                         const CostModel& cost, const DealOptions& options) {
  const size_t window = options.WindowSize();
  DealOptions consecutive = options;
  consecutive.length_aware_base_batches = false;
  std::vector<std::vector<double>> gaps(5);
  std::vector<double> costs(window);
  for (const std::vector<int64_t>& w : windows) {
    if (w.size() != window) continue;
    for (size_t i = 0; i < window; ++i) costs[i] = cost.SampleCost(w[i]);
    gaps[0].push_back(DealWindow(Policy::kNaive, costs, options).Gap());
    gaps[1].push_back(DealWindow(Policy::kSortInterleave, costs, options).Gap());
    gaps[2].push_back(DealWindow(Policy::kRecfleet, costs, options).Gap());
    gaps[3].push_back(DealWindow(Policy::kRecfleet, costs, consecutive).Gap());
    gaps[4].push_back(GapLowerBound(costs, options.ranks));
  }
  const char* names[] = {"naive", "sort-interleave", "recfleet",
                         "recfleet-consecutive-base-batches", "lower-bound"};
  std::vector<BalanceRow> rows;
  for (int i = 0; i < 5; ++i) rows.push_back({names[i], Summarize(gaps[i])});
  return rows;
}

std::vector<BalanceRow> ComputeBalance(const std::vector<int64_t>& lengths, const CostModel& cost,
                                       const DealOptions& options, uint64_t seed, int epochs) {
  const size_t window = options.WindowSize();
  std::vector<std::vector<int64_t>> windows;
  std::vector<int64_t> order = lengths;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    std::mt19937_64 rng(seed + 0x9E3779B97F4A7C15ull * epoch);
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t start = 0; start + window <= order.size(); start += window) {
      windows.emplace_back(order.begin() + start, order.begin() + start + window);
    }
  }
  return BalanceOfWindows(windows, cost, options);
}

std::string FormatBalance(const std::vector<BalanceRow>& rows) {
  char line[256];
  std::snprintf(line, sizeof(line), "%-34s %6s %9s %9s %9s %9s\n", "policy", "steps", "mean%",
                "p50%", "p99%", "max%");
  std::string out = line;
  for (const BalanceRow& r : rows) {
    std::snprintf(line, sizeof(line), "%-34s %6zu %9.4f %9.4f %9.4f %9.4f\n", r.policy.c_str(),
                  r.gap.steps, 100 * r.gap.mean, 100 * r.gap.p50, 100 * r.gap.p99, 100 * r.gap.max);
    out += line;
  }
  return out;
}

}  // namespace recfleet::data
