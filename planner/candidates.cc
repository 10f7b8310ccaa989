#include "planner/candidates.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace recfleet::planner {
namespace {

// Above this many EP combinations per FSDP group size, every expert module
// takes the same degree instead of being enumerated independently.
constexpr int kMaxEpCombinations = 256;

bool IsPowerOfTwo(int v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

std::string SparseOption::Label() const {
  if (scheme == SparseScheme::kV1) return absl::StrCat("V1 (one group of ", m, ")");
  if (scheme == SparseScheme::kV2) return absl::StrCat("V2 groups of ", m);
  return absl::StrCat("V3 groups of ", m, ", shards split ", s, "-way");
}

void SparseOption::Summarize() {
  const ShardingResult& sh = *sharding;
  double sum_out = 0;
  for (size_t r = 0; r < sh.rank_bytes.size(); ++r) {
    emb_max = std::max(emb_max, sh.rank_bytes[r]);
    out_max = std::max(out_max, sh.rank_out_bytes[r]);
    ids_max = std::max(ids_max, sh.rank_id_bytes[r]);
    touched_max = std::max(touched_max, sh.rank_touched_bytes[r]);
    compute_max = std::max(compute_max, sh.rank_compute_s[r]);
    sum_out += sh.rank_out_bytes[r];
  }
  out_mean = sh.rank_out_bytes.empty() ? 0 : sum_out / sh.rank_out_bytes.size();
  for (const TableSharding& ts : sh.tables) {
    largest_touched_table = std::max(largest_touched_table, ts.shard_touched_bytes);
  }
}

std::vector<int> GroupSizes(const Topology& t, int max_size) {
  std::vector<int> out;
  const int n = t.WorldSize();
  for (int g = 1; g <= std::min(n, max_size); ++g) {
    if (n % g != 0) continue;
    const bool nests = g <= t.NvlinkDomainSize() ? t.NvlinkDomainSize() % g == 0
                       : g <= t.ZoneSize()       ? t.ZoneSize() % g == 0 &&
                                                 g % t.NvlinkDomainSize() == 0
                                                 : g % t.ZoneSize() == 0;
    if (nests && (IsPowerOfTwo(g) || g % t.gpus_per_node == 0)) out.push_back(g);
  }
  return out;
}

std::vector<DenseOption> EnumerateDenseGroup(const Topology& t, const Model& model, int g) {
  std::vector<DenseOption> out;
  std::vector<std::vector<int>> choices(model.modules.size(), std::vector<int>{1});
  int64_t combos = 1;
  for (size_t i = 0; i < model.modules.size(); ++i) {
    const DenseModule& m = model.modules[i];
    if (!m.is_expert()) continue;
    for (int e = 2; e <= std::min(t.NvlinkDomainSize(), g); e *= 2) {
      if (m.num_experts % e == 0 && g % e == 0) choices[i].push_back(e);
    }
    combos *= static_cast<int64_t>(choices[i].size());
  }
  if (combos <= kMaxEpCombinations) {
    // Odometer over the per-module choices.
    std::vector<size_t> idx(model.modules.size(), 0);
    while (true) {
      DenseOption d{g, std::vector<int>(model.modules.size(), 1)};
      for (size_t i = 0; i < idx.size(); ++i) d.ep[i] = choices[i][idx[i]];
      out.push_back(std::move(d));
      size_t k = 0;
      while (k < idx.size() && ++idx[k] == choices[k].size()) idx[k++] = 0;
      if (k == idx.size()) break;
    }
  } else {
    for (int e = 1; e <= std::min(t.NvlinkDomainSize(), g); e *= 2) {
      DenseOption d{g, std::vector<int>(model.modules.size(), 1)};
      for (size_t i = 0; i < model.modules.size(); ++i) {
        const auto& c = choices[i];
        if (std::find(c.begin(), c.end(), e) != c.end()) d.ep[i] = e;
      }
      out.push_back(std::move(d));
    }
  }
  return out;
}

std::vector<DenseOption> EnumerateDense(const Topology& t, const Model& model,
                                        const PlannerOptions& opt) {
  std::vector<DenseOption> out;
  const int max_group = opt.allow_cross_zone_non_gradient ? t.WorldSize() : t.ZoneSize();
  for (int g : GroupSizes(t, max_group)) {
    std::vector<DenseOption> group = EnumerateDenseGroup(t, model, g);
    out.insert(out.end(), std::make_move_iterator(group.begin()),
               std::make_move_iterator(group.end()));
  }
  return out;
}

std::vector<SparseOption> EnumerateSparse(const Topology& t, const PlannerOptions& opt) {
  std::vector<SparseOption> out;
  const int n = t.WorldSize();
  const int max_span = opt.allow_cross_zone_non_gradient ? n : t.ZoneSize();
  const int max_group = opt.max_model_parallel_group > 0
                            ? std::min(max_span, opt.max_model_parallel_group)
                            : max_span;
  for (int m : GroupSizes(t, max_group)) {
    if (m < n) out.push_back({SparseScheme::kV2, m, 1});
  }
  // V1 is always a candidate: the baseline the 2D layouts must beat.
  if (n > 1) out.push_back({SparseScheme::kV1, n, 1});
  for (int s = 2; s <= t.NvlinkDomainSize(); s *= 2) {
    if (t.NvlinkDomainSize() % s != 0) continue;
    for (int span : GroupSizes(t, max_span)) {
      if (span % s == 0 && span > s && span / s <= max_group) {
        out.push_back({SparseScheme::kV3, span / s, s});
      }
    }
  }
  // A single GPU holds everything itself.
  if (n == 1) out.push_back({SparseScheme::kV2, 1, 1});
  return out;
}

}  // namespace recfleet::planner
