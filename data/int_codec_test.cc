#include "data/int_codec.h"

#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace recfleet::data {
namespace {

std::vector<int64_t> RoundTrip(const std::vector<int64_t>& v) {
  std::string bytes;
  AppendDeltaVarint(v.data(), v.size(), &bytes);
  EXPECT_EQ(bytes.size(), DeltaVarintSize(v.data(), v.size()));
  std::vector<int64_t> back(v.size());
  EXPECT_TRUE(DecodeDeltaVarint(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                v.size(), back.data()));
  return back;
}

TEST(IntCodecTest, RoundTripsExtremesAndRandomValues) {
  const int64_t lo = std::numeric_limits<int64_t>::min();
  const int64_t hi = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> v = {0, 1, -1, hi, lo, hi, 0, lo, 42};
  std::mt19937_64 rng(7);
  for (int i = 0; i < 1000; ++i) v.push_back(static_cast<int64_t>(rng()) >> (rng() % 64));
  EXPECT_EQ(RoundTrip(v), v);
  EXPECT_TRUE(RoundTrip({}).empty());
}

TEST(IntCodecTest, SortedValuesTakeOneBytePerSmallStep) {
  std::vector<int64_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 1'000'000'000 + static_cast<int64_t>(i);
  // The first value costs 5 bytes (delta from 0), each later step of 1 one byte.
  EXPECT_EQ(DeltaVarintSize(ids.data(), ids.size()), 5u + 999u);
  EXPECT_EQ(RoundTrip(ids), ids);
}

TEST(IntCodecTest, RejectsShortLongAndOverlongInput) {
  std::vector<int64_t> v = {300, 5, 70000};
  std::string bytes;
  AppendDeltaVarint(v.data(), v.size(), &bytes);
  std::vector<int64_t> out(4);
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  EXPECT_FALSE(DecodeDeltaVarint(p, bytes.size() - 1, 3, out.data()));  // Ends early.
  EXPECT_FALSE(DecodeDeltaVarint(p, bytes.size(), 2, out.data()));      // Bytes left over.
  EXPECT_FALSE(DecodeDeltaVarint(p, bytes.size(), 4, out.data()));      // Too few values.
  std::string overlong(11, '\x80');
  overlong.push_back('\x01');
  EXPECT_FALSE(DecodeDeltaVarint(reinterpret_cast<const uint8_t*>(overlong.data()),
                                 overlong.size(), 1, out.data()));
}

}  // namespace
}  // namespace recfleet::data
