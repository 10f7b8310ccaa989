#include "data/bbs.h"

#include <algorithm>
#include <numeric>
#include <queue>

#include "absl/strings/str_cat.h"

namespace recfleet::data {
namespace {

// Sizes of `n` items split into `parts` parts differing by at most one.
std::vector<size_t> EvenSizes(size_t n, size_t parts) {
  std::vector<size_t> s(parts, n / parts);
  for (size_t i = 0; i < n % parts; ++i) ++s[i];
  return s;
}

// Sizes of `n` items cut into chunks of `chunk` (the last may be short).
std::vector<size_t> ChunkSizes(size_t n, size_t chunk) {
  std::vector<size_t> s(n / chunk, chunk);
  if (n % chunk != 0) s.push_back(n % chunk);
  return s;
}

double Sum(const std::vector<double>& costs, const std::vector<uint32_t>& items) {
  double s = 0;
  for (uint32_t i : items) s += costs[i];
  return s;
}

// Tries one improving swap between group `a` (the most loaded) and the
// other groups, least loaded first. Returns false when none exists.
bool SwapOnce(const std::vector<double>& costs, std::vector<std::vector<uint32_t>>& groups,
              std::vector<double>& load, size_t a) {
  std::vector<size_t> order(groups.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return load[x] < load[y]; });
  std::vector<std::pair<double, size_t>> sorted_b;
  for (size_t b : order) {
    if (b == a) continue;
    double d = load[a] - load[b];
    if (d <= 0) break;
    // Moving delta = c_x - c_y from a to b helps iff 0 < delta < d; the best
    // delta is d / 2, which leaves the two groups equal.
    sorted_b.clear();
    for (size_t j = 0; j < groups[b].size(); ++j) sorted_b.emplace_back(costs[groups[b][j]], j);
    std::sort(sorted_b.begin(), sorted_b.end());
    double best_err = d / 2;  // Must beat "no swap" by a strict margin.
    size_t best_x = 0, best_y = 0;
    bool found = false;
    for (size_t i = 0; i < groups[a].size(); ++i) {
      double cx = costs[groups[a][i]];
      double want = cx - d / 2;  // c_y that makes delta == d / 2.
      auto it = std::lower_bound(sorted_b.begin(), sorted_b.end(), std::make_pair(want, size_t{0}));
      for (auto jt : {it, it == sorted_b.begin() ? it : it - 1}) {
        if (jt == sorted_b.end()) continue;
        double delta = cx - jt->first;
        if (delta <= 0 || delta >= d) continue;
        double err = std::abs(delta - d / 2);
        if (err < best_err) {
          best_err = err;
          best_x = i;
          best_y = jt->second;
          found = true;
        }
      }
    }
    if (found) {
      double delta = costs[groups[a][best_x]] - costs[groups[b][best_y]];
      std::swap(groups[a][best_x], groups[b][best_y]);
      load[a] -= delta;
      load[b] += delta;
      return true;
    }
  }
  return false;
}

void OrderForMicroBatches(const std::vector<double>& costs, std::vector<std::vector<uint32_t>>& bbs,
                          int micro, int rounds) {
  if (micro <= 1 || bbs.size() <= static_cast<size_t>(micro)) return;
  std::vector<double> bb_cost(bbs.size());
  std::vector<uint32_t> ids(bbs.size());
  for (size_t j = 0; j < bbs.size(); ++j) {
    bb_cost[j] = Sum(costs, bbs[j]);
    ids[j] = static_cast<uint32_t>(j);
  }
  auto groups = BalancedPartition(bb_cost, ids, ChunkSizes(bbs.size(), micro), rounds);
  std::vector<std::vector<uint32_t>> out;
  for (const auto& g : groups) {
    for (uint32_t j : g) out.push_back(std::move(bbs[j]));
  }
  bbs = std::move(out);
}

}  // namespace

absl::string_view PolicyName(Policy p) {
  switch (p) {
    case Policy::kNaive:
      return "naive";
    case Policy::kSortInterleave:
      return "sort-interleave";
    case Policy::kRecfleet:
      return "recfleet";
  }
  return "unknown";
}

absl::StatusOr<Policy> ParsePolicy(absl::string_view name) {
  for (Policy p : {Policy::kNaive, Policy::kSortInterleave, Policy::kRecfleet}) {
    if (name == PolicyName(p)) return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown policy '", name, "'; expected naive, sort-interleave or recfleet"));
}

double Deal::Gap() const {
  if (rank_cost.empty()) return 0;
  double mean = std::accumulate(rank_cost.begin(), rank_cost.end(), 0.0) / rank_cost.size();
  double mx = *std::max_element(rank_cost.begin(), rank_cost.end());
  return mean > 0 ? mx / mean - 1 : 0;
}

std::vector<std::vector<uint32_t>> BalancedPartition(const std::vector<double>& costs,
                                                     const std::vector<uint32_t>& items,
                                                     const std::vector<size_t>& sizes,
                                                     int max_swap_rounds) {
  std::vector<std::vector<uint32_t>> groups(sizes.size());
  if (sizes.empty()) return groups;
  std::vector<double> load(sizes.size(), 0.0);
  for (size_t g = 0; g < sizes.size(); ++g) groups[g].reserve(sizes[g]);
  std::vector<uint32_t> sorted = items;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](uint32_t x, uint32_t y) { return costs[x] > costs[y]; });
  // Greedy: heaviest first onto the least-loaded group with room; ties go to
  // the lower group index so the result is deterministic.
  using Entry = std::pair<double, size_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> open;
  for (size_t g = 0; g < sizes.size(); ++g) {
    if (sizes[g] > 0) open.emplace(0.0, g);
  }
  for (uint32_t i : sorted) {
    auto [l, g] = open.top();
    open.pop();
    groups[g].push_back(i);
    load[g] = l + costs[i];
    if (groups[g].size() < sizes[g]) open.emplace(load[g], g);
  }
  double mean = std::accumulate(load.begin(), load.end(), 0.0) / std::max<size_t>(1, load.size());
  for (int round = 0; round < max_swap_rounds; ++round) {
    size_t a = std::max_element(load.begin(), load.end()) - load.begin();
    if (load[a] <= mean * (1 + 1e-9)) break;
    if (!SwapOnce(costs, groups, load, a)) break;
  }
  return groups;
}

double GapLowerBound(const std::vector<double>& costs, int ranks) {
  if (costs.empty()) return 0;
  std::vector<double> s = costs;
  std::sort(s.begin(), s.end());
  double total = std::accumulate(s.begin(), s.end(), 0.0);
  double mean = total / ranks;
  size_t per_rank = s.size() / ranks;  // The rank with the maximum has at least this many.
  double heavy = s.back();
  for (size_t i = 0; i + 1 < per_rank; ++i) heavy += s[i];
  return mean > 0 ? std::max(0.0, heavy / mean - 1) : 0;
}

Deal DealWindow(Policy policy, const std::vector<double>& costs, const DealOptions& o) {
  const size_t n = costs.size();
  const size_t r_count = o.ranks;
  Deal deal;
  deal.ranks.assign(r_count, {});
  std::vector<uint32_t> all(n);
  std::iota(all.begin(), all.end(), 0);

  if (policy == Policy::kNaive) {
    std::vector<size_t> sizes = EvenSizes(n, r_count);
    uint32_t next = 0;
    for (size_t r = 0; r < r_count; ++r) {
      for (size_t len : ChunkSizes(sizes[r], o.base_batch)) {
        std::vector<uint32_t> bb(len);
        std::iota(bb.begin(), bb.end(), next);
        next += len;
        deal.ranks[r].push_back(std::move(bb));
      }
    }
  } else if (policy == Policy::kSortInterleave || !o.length_aware_base_batches) {
    // Consecutive base batches as the unit of dealing.
    std::vector<std::vector<uint32_t>> bbs;
    std::vector<double> bb_cost;
    uint32_t next = 0;
    for (size_t len : ChunkSizes(n, o.base_batch)) {
      std::vector<uint32_t> bb(len);
      std::iota(bb.begin(), bb.end(), next);
      next += len;
      bb_cost.push_back(Sum(costs, bb));
      bbs.push_back(std::move(bb));
    }
    if (policy == Policy::kSortInterleave) {
      std::vector<uint32_t> order(bbs.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](uint32_t x, uint32_t y) { return bb_cost[x] > bb_cost[y]; });
      for (size_t i = 0; i < order.size(); ++i) {
        size_t round = i / r_count, pos = i % r_count;
        size_t r = round % 2 == 0 ? pos : r_count - 1 - pos;
        deal.ranks[r].push_back(std::move(bbs[order[i]]));
      }
    } else {
      std::vector<uint32_t> ids(bbs.size());
      std::iota(ids.begin(), ids.end(), 0);
      auto groups =
          BalancedPartition(bb_cost, ids, EvenSizes(bbs.size(), r_count), o.max_swap_rounds);
      for (size_t r = 0; r < r_count; ++r) {
        for (uint32_t j : groups[r]) deal.ranks[r].push_back(std::move(bbs[j]));
        OrderForMicroBatches(costs, deal.ranks[r], o.micro_batch_base_batches, o.max_swap_rounds);
      }
    }
  } else {
    // Length-aware: partition samples among ranks, then each rank's samples
    // into base batches of equal cost.
    auto per_rank = BalancedPartition(costs, all, EvenSizes(n, r_count), o.max_swap_rounds);
    for (size_t r = 0; r < r_count; ++r) {
      std::sort(per_rank[r].begin(), per_rank[r].end());
      deal.ranks[r] = BalancedPartition(
          costs, per_rank[r], ChunkSizes(per_rank[r].size(), o.base_batch), o.max_swap_rounds);
      for (auto& bb : deal.ranks[r]) std::sort(bb.begin(), bb.end());
      OrderForMicroBatches(costs, deal.ranks[r], o.micro_batch_base_batches, o.max_swap_rounds);
    }
  }
  deal.rank_cost.assign(r_count, 0.0);
  for (size_t r = 0; r < r_count; ++r) {
    for (const auto& bb : deal.ranks[r]) deal.rank_cost[r] += Sum(costs, bb);
  }
  return deal;
}

}  // namespace recfleet::data
