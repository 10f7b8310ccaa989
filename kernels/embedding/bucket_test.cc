// The bucketing (CPU) against the straightforward per-rank routing.

#include "kernels/embedding/bucket.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/embedding/bucket_testing.h"

namespace recfleet {
namespace {

TensorView HostView(const std::vector<int64_t>& v) {
  return MakeView(const_cast<int64_t*>(v.data()), DType::kInt64, {static_cast<int64_t>(v.size())});
}

BucketResult Bucket(const BucketCase& c) {
  BucketResult r;
  r.lengths.assign(c.num_lengths, -1);
  r.routed.assign(c.num_routed, -1);
  r.counts.assign(c.num_counts, -1);
  const absl::Status s =
      BucketIdsByShard(Bucketings(c, HostView), HostView(r.lengths), HostView(r.routed), HostView(r.counts));
  EXPECT_TRUE(s.ok()) << s;
  return r;
}

void ExpectSame(const BucketResult& got, const BucketResult& want) {
  EXPECT_EQ(got.lengths, want.lengths);
  EXPECT_EQ(got.routed, want.routed);
  EXPECT_EQ(got.counts, want.counts);
}

TEST(BucketIdsByShardTest, MatchesPerRankRoutingOnRandomShardings) {
  for (int iter = 0; iter < 300; ++iter) {
    const BucketCase c = RandomBucketCase(1 + iter % 6, 1 + iter % 5, iter % 3 == 0);
    SCOPED_TRACE(iter);
    ExpectSame(Bucket(c), ReferenceBucketing(c));
  }
}

// Row-wise over three ranks with every id in the first block, and a
// table-wise table: ranks 1 and 2 receive no ids (zero lengths and counts),
// and the empty bags give zero lengths everywhere.
TEST(BucketIdsByShardTest, RanksReceivingNothingGetZeroLengths) {
  BucketCase c;
  c.group = 3;
  c.ids = {{0, 9, 3, 3}, {4}};
  c.offsets = {{0, 2, 2, 4, 4}, {0, 0, 1}};
  // Rank-major layout: rank 0 holds rows [0, 10) of table 0 and table 1;
  // ranks 1 and 2 rows [10, 20) and [20, 30) of table 0.
  c.shards = {{{0, 10, 0, 0}, {10, 20, 6, 2}, {20, 30, 10, 4}}, {{0, 5, 4, 1}}};
  c.num_lengths = 14;
  c.num_routed = 5;
  c.num_counts = 6;
  const BucketResult got = Bucket(c);
  EXPECT_EQ(got.lengths, (std::vector<int64_t>{2, 0, 2, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(got.routed, (std::vector<int64_t>{0, 9, 3, 3, 4}));
  EXPECT_EQ(got.counts, (std::vector<int64_t>{4, 1, 0, 0, 0, 0}));
  ExpectSame(got, ReferenceBucketing(c));
}

// Column-wise: every holder gets every id, unshifted.
TEST(BucketIdsByShardTest, ColumnSlicesEachGetEveryId) {
  BucketCase c;
  c.group = 2;
  c.ids = {{7, 1, 7}};
  c.offsets = {{0, 1, 3}};
  c.shards = {{{0, 8, 0, 0}, {0, 8, 2, 1}}};
  c.num_lengths = 4;
  c.num_routed = 6;
  c.num_counts = 2;
  const BucketResult got = Bucket(c);
  EXPECT_EQ(got.lengths, (std::vector<int64_t>{1, 2, 1, 2}));
  EXPECT_EQ(got.routed, (std::vector<int64_t>{7, 1, 7, 7, 1, 7}));
  EXPECT_EQ(got.counts, (std::vector<int64_t>{3, 3}));
}

TEST(BucketIdsByShardTest, RejectsALayoutThatDoesNotCoverTheLengths) {
  BucketCase c;
  c.ids = {{1, 2}};
  c.offsets = {{0, 2}};
  c.shards = {{{0, 4, 0, 0}}};
  c.num_lengths = 2;  // lengths[1] belongs to no shard.
  c.num_routed = 2;
  c.num_counts = 1;
  std::vector<int64_t> lengths(2), routed(2), counts(1);
  absl::Status s =
      BucketIdsByShard(Bucketings(c, HostView), HostView(lengths), HostView(routed), HostView(counts));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;

  c.num_lengths = 1;
  std::vector<int64_t> one(1), short_routed(1);
  s = BucketIdsByShard(Bucketings(c, HostView), HostView(one), HostView(short_routed), HostView(counts));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("routed"), absl::string_view::npos) << s;

  c.shards[0][0].count_slot = 1;
  s = BucketIdsByShard(Bucketings(c, HostView), HostView(one), HostView(routed), HostView(counts));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST(OffsetsFromLengthsTest, RunningSumFromZero) {
  std::vector<int64_t> lengths = {3, 0, 2, 0}, offsets(5, -1);
  ASSERT_TRUE(OffsetsFromLengths(HostView(lengths), HostView(offsets)).ok());
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 3, 3, 5, 5}));
  std::vector<int64_t> none, zero(1, -1);
  ASSERT_TRUE(OffsetsFromLengths(HostView(none), HostView(zero)).ok());
  EXPECT_EQ(zero, (std::vector<int64_t>{0}));
}

}  // namespace
}  // namespace recfleet
