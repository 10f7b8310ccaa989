#include "kernels/embedding/bucket_testing.h"

#include <algorithm>
#include <random>

#include "kernels/base/test_random.h"

namespace recfleet {

BucketCase RandomBucketCase(int group, int tables, bool skewed) {
  std::mt19937_64& rng = TestRng();
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  BucketCase c;
  c.group = group;
  c.num_counts = static_cast<int64_t>(group) * tables;
  // Per table, per rank: the rows it holds ({0, 0}: none).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> held(tables);
  for (int t = 0; t < tables; ++t) {
    const int64_t rows = uniform(1, 50);
    held[t].assign(group, {0, 0});
    std::vector<int> ranks(group);
    for (int r = 0; r < group; ++r) ranks[r] = r;
    std::shuffle(ranks.begin(), ranks.end(), rng);
    const int kind = static_cast<int>(uniform(0, 2));
    if (kind == 0) {  // Table-wise.
      held[t][ranks[0]] = {0, rows};
    } else {
      const int holders = static_cast<int>(uniform(1, group));
      const int64_t block = (rows + holders - 1) / holders;
      for (int s = 0; s < holders; ++s) {
        held[t][ranks[s]] = kind == 1 ? std::make_pair(std::min(rows, s * block), std::min(rows, (s + 1) * block))
                                      : std::make_pair(int64_t{0}, rows);
      }
    }
    const int64_t bags = uniform(0, 4) == 0 ? 0 : uniform(1, 40);
    const int64_t id_rows = skewed ? std::max<int64_t>(1, rows / group / 2) : rows;
    c.offsets.push_back({0});
    c.ids.emplace_back();
    for (int64_t b = 0; b < bags; ++b) {
      const int64_t n = uniform(0, 3) == 0 ? 0 : uniform(1, 8);
      for (int64_t i = 0; i < n; ++i) c.ids[t].push_back(uniform(0, id_rows - 1));
      c.offsets[t].push_back(static_cast<int64_t>(c.ids[t].size()));
    }
  }
  c.shards.assign(tables, {});
  for (int d = 0; d < group; ++d) {
    for (int t = 0; t < tables; ++t) {
      const auto [first, end] = held[t][d];
      if (end <= first) continue;
      c.shards[t].push_back({first, end, c.num_lengths, static_cast<int64_t>(d) * tables + t});
      c.num_lengths += static_cast<int64_t>(c.offsets[t].size()) - 1;
      for (int64_t id : c.ids[t]) c.num_routed += id >= first && id < end;
    }
  }
  return c;
}

BucketResult ReferenceBucketing(const BucketCase& c) {
  const int tables = static_cast<int>(c.ids.size());
  BucketResult r;
  r.counts.assign(c.num_counts, 0);
  for (int d = 0; d < c.group; ++d) {
    for (int t = 0; t < tables; ++t) {
      for (const IdShard& s : c.shards[t]) {
        if (s.count_slot != static_cast<int64_t>(d) * tables + t) continue;
        for (size_t b = 0; b + 1 < c.offsets[t].size(); ++b) {
          int64_t n = 0;
          for (int64_t i = c.offsets[t][b]; i < c.offsets[t][b + 1]; ++i) {
            const int64_t id = c.ids[t][i];
            if (id >= s.first && id < s.end) {
              r.routed.push_back(id - s.first);
              ++n;
            }
          }
          r.lengths.push_back(n);
          r.counts[s.count_slot] += n;
        }
      }
    }
  }
  return r;
}

std::vector<IdBucketing> Bucketings(const BucketCase& c,
                                    const std::function<TensorView(const std::vector<int64_t>&)>& place) {
  std::vector<IdBucketing> out;
  for (size_t t = 0; t < c.ids.size(); ++t) out.push_back({{place(c.ids[t]), place(c.offsets[t])}, c.shards[t]});
  return out;
}

}  // namespace recfleet
