#include "kernels/attention/tile_plan.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/hash/hash.h"
#include "gtest/gtest.h"
#include "kernels/attention/attention_internal.h"

namespace recfleet::attention::internal {
namespace {

using cuda_impl::WorkItem;

// Offsets of the given lengths.
std::vector<int64_t> OffsetsOf(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> o{0};
  for (int64_t l : lengths) o.push_back(o.back() + l);
  return o;
}

TensorView Offsets(const std::vector<int64_t>& o) {
  return MakeView(const_cast<int64_t*>(o.data()), DType::kInt64,
                  {static_cast<int64_t>(o.size())});
}

AttentionInputs Inputs(const std::vector<int64_t>& q_off, const std::vector<int64_t>& k_off,
                       int64_t heads = 2) {
  static char storage;
  AttentionInputs in;
  in.q = {MakeView(&storage, DType::kBFloat16, {q_off.back(), heads, 64}, Device::kCuda),
          Offsets(q_off)};
  in.k = {MakeView(&storage, DType::kBFloat16, {k_off.back(), heads, 64}, Device::kCuda),
          Offsets(k_off)};
  in.v = in.k.values;
  return in;
}

std::vector<int64_t> RandomLengths(std::mt19937_64& rng, int n, int64_t max) {
  std::uniform_int_distribution<int64_t> len(0, max);
  std::vector<int64_t> v(n);
  for (int64_t& l : v) l = len(rng);
  // The ragged edges: empty, one, a tile's size +- 1.
  v[0] = 0;
  v[1] = 1;
  v[2] = 63;
  v[3] = 65;
  v[4] = 128;
  return v;
}

// Every query row of every sequence is in exactly one of `tiles`' items
// (tile_row .. + rows * q_tiles), and the item's inner range holds every key
// the row sees; non-empty items only, longest first.
void ExpectCoversQueries(const std::vector<WorkItem>& tiles, const AttentionInputs& in,
                         const AttentionOptions& o, int64_t rows) {
  std::vector<int> seen(in.q.total_length(), 0);
  int64_t previous_work = INT64_MAX;
  for (const WorkItem& it : tiles) {
    const int64_t work = static_cast<int64_t>(it.inner_end - it.inner_begin) * it.q_tiles;
    EXPECT_LE(work, previous_work) << "not longest first";
    previous_work = work;
    for (int64_t i = it.tile_row; i < std::min<int64_t>(it.q_len, it.tile_row + rows * it.q_tiles);
         ++i) {
      ++seen[it.q_start + i];
      const KeyRange keys = VisibleKeys(o, it.q_len, it.k_len, i);
      if (keys.size() > 0) {
        EXPECT_LE(it.inner_begin, keys.begin);
        EXPECT_GE(it.inner_end, keys.end);
      }
    }
  }
  for (int64_t r = 0; r < in.q.total_length(); ++r) EXPECT_EQ(seen[r], 1) << "query row " << r;
}

TEST(TilePlanTest, ForwardAndDqTilesCoverEveryQueryWithTheKeysItSees) {
  std::mt19937_64 rng(7);
  for (Mask mask : {Mask::kNone, Mask::kCausal, Mask::kSlidingWindow, Mask::kBlock}) {
    const std::vector<int64_t> lengths = RandomLengths(rng, 40, 300);
    const std::vector<int64_t> off = OffsetsOf(lengths);
    AttentionOptions o;
    o.mask = mask;
    o.window = 37;
    const AttentionInputs in = Inputs(off, off);
    const TilePlan plan = MakeTilePlan(in, o);
    ExpectCoversQueries(plan.forward_tiles, in, o, cuda_impl::kForwardTileRows);
    ExpectCoversQueries(plan.grouped_tiles, in, o, cuda_impl::kForwardTileRows);
    ExpectCoversQueries(plan.query_tiles, in, o, cuda_impl::kTileRows);
    EXPECT_EQ(plan.block_kernel, mask == Mask::kBlock);
    EXPECT_EQ(plan.blocks.empty(), mask != Mask::kBlock);
  }
}

TEST(TilePlanTest, CrossAttentionGroupsQueryTilesOfAShortHistory) {
  // 600 queries per sample against 100 keys: 5 forward tiles of one sample
  // share the inner range, grouped by up to kWgmmaMaxGroup.
  const std::vector<int64_t> q_off = OffsetsOf({600, 600}), k_off = OffsetsOf({100, 100});
  const AttentionInputs in = Inputs(q_off, k_off);
  const TilePlan plan = MakeTilePlan(in, AttentionOptions());
  EXPECT_EQ(plan.forward_tiles.size(), 10u);
  EXPECT_EQ(plan.grouped_tiles.size(), 4u);  // 4 + 1 per sample
  ExpectCoversQueries(plan.grouped_tiles, in, AttentionOptions(), cuda_impl::kForwardTileRows);
  EXPECT_FALSE(plan.block_kernel);
}

// The counting sort (works in a short range) and the merge sort (a long
// one) give std::stable_sort's order.
TEST(TilePlanTest, SortLongestFirstIsAStableSortByWork) {
  std::mt19937_64 rng(3);
  for (int64_t max_inner : {int64_t{300}, int64_t{1} << 24}) {
    std::uniform_int_distribution<int64_t> inner(0, max_inner), group(1, 4);
    std::vector<WorkItem> items(5000);
    for (size_t i = 0; i < items.size(); ++i) {
      items[i] = WorkItem{};
      items[i].tile_row = static_cast<int>(i);  // identifies the item
      items[i].inner_end = static_cast<int>(inner(rng));
      items[i].q_tiles = static_cast<int>(group(rng));
    }
    std::vector<WorkItem> expected = items;
    std::stable_sort(expected.begin(), expected.end(), [](const WorkItem& a, const WorkItem& b) {
      return static_cast<int64_t>(a.inner_end) * a.q_tiles >
             static_cast<int64_t>(b.inner_end) * b.q_tiles;
    });
    SortLongestFirst(items);
    ASSERT_EQ(items.size(), expected.size());
    for (size_t i = 0; i < items.size(); ++i) {
      ASSERT_EQ(items[i].tile_row, expected[i].tile_row) << "max_inner " << max_inner << " at " << i;
    }
  }
}

TEST(VisiblePairsTest, EqualsTheSumOverQueriesOfTheirVisibleKeys) {
  for (Mask mask : {Mask::kNone, Mask::kCausal, Mask::kSlidingWindow, Mask::kBlock}) {
    for (int64_t window : {0, 1, 5, 64, 200}) {
      AttentionOptions o;
      o.mask = mask;
      o.window = window;
      for (int64_t lq = 0; lq <= 140; lq += (lq < 70 ? 1 : 7)) {
        for (int64_t lk = 0; lk <= 140; lk += (lk < 70 ? 1 : 7)) {
          int64_t brute = 0;
          for (int64_t i = 0; i < lq; ++i) brute += VisibleKeys(o, lq, lk, i).size();
          ASSERT_EQ(VisiblePairs(o, lq, lk), brute)
              << "mask " << static_cast<int>(mask) << " window " << window << " lq " << lq
              << " lk " << lk;
        }
      }
    }
  }
}

TEST(TilePlanTest, KeyOfEqualOffsetsIsEqualAndHashesEqual) {
  const std::vector<int64_t> a = OffsetsOf({3, 0, 70, 5}), b = OffsetsOf({3, 0, 70, 5});
  AttentionOptions o;
  o.mask = Mask::kBlock;
  const TilePlanKey ka(0, Inputs(a, a), o), kb(0, Inputs(b, b, /*heads=*/4), o);
  EXPECT_TRUE(ka == kb);  // heads and values do not matter
  EXPECT_EQ(absl::HashOf(ka), absl::HashOf(kb));
  // int32 offsets give the same key as int64 ones.
  std::vector<int32_t> a32(a.begin(), a.end());
  AttentionInputs in32 = Inputs(a, a);
  in32.q.offsets = MakeView(a32.data(), DType::kInt32, {static_cast<int64_t>(a32.size())});
  in32.k.offsets = in32.q.offsets;
  EXPECT_TRUE(TilePlanKey(0, in32, o) == ka);
}

TEST(TilePlanTest, KeyChangesWithLengthsMaskWindowAndDevice) {
  const std::vector<int64_t> a = OffsetsOf({3, 0, 70, 5});
  // Same total, one length moved to its neighbour.
  const std::vector<int64_t> moved = OffsetsOf({3, 1, 69, 5});
  AttentionOptions o;
  o.mask = Mask::kSlidingWindow;
  o.window = 16;
  const TilePlanKey base(0, Inputs(a, a), o);
  EXPECT_FALSE(TilePlanKey(0, Inputs(moved, moved), o) == base);
  EXPECT_FALSE(TilePlanKey(0, Inputs(a, moved), o) == base);
  EXPECT_FALSE(TilePlanKey(1, Inputs(a, a), o) == base);
  AttentionOptions wider = o;
  wider.window = 17;
  EXPECT_FALSE(TilePlanKey(0, Inputs(a, a), wider) == base);
  AttentionOptions causal = o;
  causal.mask = Mask::kCausal;
  EXPECT_FALSE(TilePlanKey(0, Inputs(a, a), causal) == base);
  // The window is not part of the key of the other masks: their plans do
  // not depend on it.
  AttentionOptions none_a, none_b;
  none_b.window = 99;
  EXPECT_TRUE(TilePlanKey(0, Inputs(a, a), none_a) == TilePlanKey(0, Inputs(a, a), none_b));
  // The same plan from equal keys.
  const TilePlan p1 = MakeTilePlan(Inputs(a, a), o), p2 = MakeTilePlan(Inputs(a, a), o);
  ASSERT_EQ(p1.forward_tiles.size(), p2.forward_tiles.size());
  EXPECT_EQ(MeanStreamedTiles(p1.wide_key_tiles), MeanStreamedTiles(p2.wide_key_tiles));
}

}  // namespace
}  // namespace recfleet::attention::internal
