// sorted_runs against brute force on stably sorted random ids: every id has
// exactly one first occurrence, and from it ForEachLaterOccurrence visits
// exactly the id's other positions, in order.

#include "kernels/embedding/sorted_runs.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/test_random.h"

namespace recfleet::sorted_runs {
namespace {

TEST(SortedRunsTest, LowBitsToSkipSavesAPassOnlyForOneOrTwoBits) {
  EXPECT_EQ(LowBitsToSkip(25), 1);  // 20M rows: 4 radix passes -> 3
  EXPECT_EQ(LowBitsToSkip(17), 1);
  EXPECT_EQ(LowBitsToSkip(10), 2);
  EXPECT_EQ(LowBitsToSkip(24), 0);
  EXPECT_EQ(LowBitsToSkip(12), 0);  // would need 4 skipped bits: buckets too wide
  EXPECT_EQ(LowBitsToSkip(9), 1);
  EXPECT_EQ(LowBitsToSkip(8), 0);
  EXPECT_EQ(LowBitsToSkip(2), 0);  // one pass either way
}

// Ids of `bits` bits with a few hot ones, sorted by id >> lo (stable, as the
// radix sort is), checked position by position.
void Check(int bits, int lo, int64_t n) {
  SCOPED_TRACE(::testing::Message() << bits << "-bit ids, lo " << lo << ", n " << n);
  std::mt19937_64& rng = TestRng();
  std::uniform_int_distribution<int64_t> any(0, (int64_t{1} << bits) - 1);
  std::vector<int64_t> hot = {any(rng), any(rng), any(rng) ^ 1};
  std::vector<int64_t> keys(n);
  for (int64_t& k : keys) k = rng() % 4 == 0 ? hot[rng() % hot.size()] : any(rng);
  std::stable_sort(keys.begin(), keys.end(),
                   [lo](int64_t a, int64_t b) { return (a >> lo) < (b >> lo); });
  std::map<int64_t, std::vector<int64_t>> where;
  for (int64_t q = 0; q < n; ++q) where[keys[q]].push_back(q);
  auto key_at = [&keys](int64_t q) { return keys[q]; };
  int64_t owners = 0;
  for (int64_t p = 0; p < n; ++p) {
    const int64_t id = keys[p];
    const bool first = FirstOccurrence(key_at, p, id, lo);
    ASSERT_EQ(first, where[id].front() == p) << "position " << p << " id " << id;
    if (!first) continue;
    ++owners;
    std::vector<int64_t> seen = {p};
    ForEachLaterOccurrence(key_at, n, p, id, lo, [&seen](int64_t q) { seen.push_back(q); });
    EXPECT_EQ(seen, where[id]) << "id " << id;
  }
  EXPECT_EQ(owners, static_cast<int64_t>(where.size()));
}

TEST(SortedRunsTest, EachIdHasOneOwnerThatFindsAllItsOccurrences) {
  for (int lo : {0, 1, 2}) {
    Check(10, lo, 5000);  // ~5 occurrences per id, hot ids in mixed buckets
    Check(25, lo, 3000);  // mostly distinct
    Check(3, lo, 200);    // a handful of ids: long runs
    Check(10, lo, 1);
  }
}

}  // namespace
}  // namespace recfleet::sorted_runs
