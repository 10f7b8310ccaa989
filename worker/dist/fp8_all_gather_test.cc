#include "worker/dist/fp8_all_gather.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/testing.h"
#include "worker/dist/fp8_all_gather_testing.h"
#include "worker/dist/fsdp.h"

namespace recfleet {
namespace dist {
namespace {

// `group` Gloo ranks (threads) gather `params`; see GatherOnRanks.
Gathered GatherOnGloo(int group, const std::vector<float>& params,
                      const std::vector<std::pair<int64_t, int64_t>>& fp8_ranges, bool fp8, bool started = false) {
  comm::HostTestMemory memory;
  return GatherOnRanks(group, params, fp8_ranges, fp8, memory, [](int) { return comm::LoopbackGloo(); }, 0, started);
}

bool InRanges(int64_t i, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  for (const auto& [b, e] : ranges) {
    if (i >= b && i < e) return true;
  }
  return false;
}

// Ranges that cut shards and 32-element rows anywhere: every rank ends with
// the same buffer, exact outside the ranges and within E4M3's rounding
// inside them (relative 2^-4 for normal values; below the block's smallest
// normal, an absolute step of scale x 2^-9 with scale <= 2 amax / 448).
TEST(Fp8AllGatherTest, EveryRankGetsTheSameRoundedBufferExactOutsideTheRanges) {
  const std::vector<float> params = WeightLikeParameters(10'007, 1);
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{5, 2'300}, {2'300, 2'333}, {4'000, 9'990}};
  const Gathered g = GatherOnGloo(3, params, ranges, true);
  float amax = 0;
  for (float v : params) amax = std::max(amax, std::fabs(v));
  int64_t rounded = 0;
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(g.full[r], g.full[0]) << "rank " << r;
  }
  for (int64_t i = 0; i < static_cast<int64_t>(params.size()); ++i) {
    const float x = params[i], y = g.full[0][i];
    if (!InRanges(i, ranges)) {
      ASSERT_EQ(y, x) << "element " << i << " lies outside the FP8 ranges";
      continue;
    }
    rounded += y != x;
    ASSERT_LE(std::fabs(y - x), std::ldexp(std::fabs(x), -4) + 2 * amax / 448 * std::ldexp(1.0f, -9))
        << "element " << i;
  }
  EXPECT_GT(rounded, 1000);  // The ranges did travel as FP8.
  EXPECT_EQ(g.fp8_numel, (2'333 - 5) + (9'990 - 4'000));
  for (size_t i = params.size(); i < g.full[0].size(); ++i) EXPECT_EQ(g.full[0][i], 0.0f) << "padding";
  // Started (FSDP prefetch's form): the same buffer once the handle is ready.
  const Gathered started = GatherOnGloo(3, params, ranges, true, /*started=*/true);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(started.full[r], g.full[0]) << "rank " << r;
  EXPECT_EQ(started.bytes, g.bytes);
}

// The bytes each rank hands to the collective, counted at the communicator:
// a buffer all of whose elements travel FP8 costs 1 + 1/1024 bytes per
// element plus the slot's 16-byte rounding, against 2 (bf16) and 4 (fp32).
TEST(Fp8AllGatherTest, HalvesTheBytesOfABf16Gather) {
  constexpr int kGroup = 4;
  const int64_t n = kGroup * 64 * 1024;
  const std::vector<float> params = WeightLikeParameters(n, 2);
  const Gathered fp32 = GatherOnGloo(kGroup, params, {}, false);
  const Gathered fp8 = GatherOnGloo(kGroup, params, {{0, n}}, true);
  for (int r = 0; r < kGroup; ++r) {
    EXPECT_EQ(fp32.bytes[r], n / kGroup * 4);
    EXPECT_EQ(fp8.bytes[r], fp8.slot_bytes);
  }
  const double bf16_bytes = n / kGroup * 2.0;
  const double vs_bf16 = fp8.bytes[0] / bf16_bytes, vs_fp32 = fp8.bytes[0] / static_cast<double>(fp32.bytes[0]);
  std::printf("all-gather bytes per rank: fp32 %lld, bf16 %.0f, fp8 %lld (%.4fx bf16, %.4fx fp32)\n",
              static_cast<long long>(fp32.bytes[0]), bf16_bytes, static_cast<long long>(fp8.bytes[0]), vs_bf16,
              vs_fp32);
  EXPECT_LE(vs_bf16, 0.5 * (1 + 1.0 / 1024) + 1e-9);
  EXPECT_LE(vs_fp32, 0.25 * (1 + 1.0 / 1024) + 1e-9);
  // No FP8 range: the slot is the fp32 shard (rounded to 16 bytes).
  const Gathered none = GatherOnGloo(kGroup, params, {}, true);
  EXPECT_EQ(none.bytes[0], fp32.bytes[0]);
  EXPECT_EQ(none.full[0], fp32.full[0]);
}

TEST(Fp8AllGatherTest, RejectsBadRanges) {
  comm::InProcessKvStore store;
  auto comms = comm::ConnectGlooGroup(store, 1, comm::CommOptions());
  ASSERT_TRUE(comms.ok());
  const FlatShardLayout layout = FlatShardLayout::Make(100, 1);
  EXPECT_EQ(Fp8AllGather::Create(layout, (*comms)[0].get(), {{10, 20}, {15, 30}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Fp8AllGather::Create(layout, (*comms)[0].get(), {{90, 101}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Fp8AllGather::Create(layout, nullptr, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dist
}  // namespace recfleet
