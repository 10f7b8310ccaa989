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
Gathered GatherOnGloo(int group, const std::vector<float>& params, const std::vector<Fp8Matrix>& matrices, bool fp8,
                      bool started = false) {
  comm::HostTestMemory memory;
  return GatherOnRanks(group, params, matrices, fp8, memory, [](int) { return comm::LoopbackGloo(); }, 0, started);
}

// Matrices with partial edge tiles, which the 3 shards cut mid-row and
// mid-tile: every rank ends with the same buffer, exact outside the
// matrices and, inside them, exactly what the FP8 GEMMs make of the whole
// fp32 matrix (128x128 tiles, scale amax / 448), although no rank holds a
// whole tile.
TEST(Fp8AllGatherTest, EveryRankGetsTheGemmsQuantizationOfTheWholeMatrices) {
  const std::vector<float> params = WeightLikeParameters(10'007, 1);
  const std::vector<Fp8Matrix> matrices = {{5, 45, 51}, {2'300, 1, 33}, {4'000, 30, 199}};
  const Gathered g = GatherOnGloo(3, params, matrices, true);
  std::vector<std::vector<uint8_t>> codes;
  std::vector<std::vector<float>> scales;
  const std::vector<float> want = QuantizedLikeTheGemms(params, matrices, &codes, &scales);
  int64_t rounded = 0;
  for (int r = 0; r < 3; ++r) ASSERT_EQ(g.full[r], g.full[0]) << "rank " << r;
  // Each whole matrix's codes and tile scales, kept for the FP8 GEMMs
  // (keep_codes), are Quantize's for the whole matrix on every rank.
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(g.codes[r], codes) << "rank " << r;
    EXPECT_EQ(g.tile_scales[r], scales) << "rank " << r;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_EQ(g.full[0][i], want[i]) << "element " << i;
    rounded += want[i] != params[i];
  }
  EXPECT_GT(rounded, 1000);  // The matrices did travel as FP8.
  EXPECT_EQ(g.fp8_numel, 45 * 51 + 33 + 30 * 199);
  for (size_t i = params.size(); i < g.full[0].size(); ++i) EXPECT_EQ(g.full[0][i], 0.0f) << "padding";
  // One fp32 maximum per tile all-reduced: 1 + 1 + 2 tiles.
  for (int r = 0; r < 3; ++r) EXPECT_EQ(g.reduce_bytes[r], 4 * 4) << "rank " << r;
  // Started (FSDP prefetch's form): the same buffer once the handle is ready.
  const Gathered started = GatherOnGloo(3, params, matrices, true, /*started=*/true);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(started.full[r], g.full[0]) << "rank " << r;
  EXPECT_EQ(started.codes, g.codes);
  EXPECT_EQ(started.tile_scales, g.tile_scales);
  EXPECT_EQ(started.bytes, g.bytes);
  EXPECT_EQ(started.reduce_bytes, g.reduce_bytes);
}

// The bytes each rank hands to the collectives, counted at the
// communicator: a buffer all of whose elements are one FP8 matrix costs 1
// byte per element (plus the slot's 16-byte rounding) on the all-gather and
// 4 bytes per 128x128 tile on the all-reduce before it, against 2 (bf16)
// and 4 (fp32) bytes per element.
TEST(Fp8AllGatherTest, HalvesTheBytesOfABf16Gather) {
  constexpr int kGroup = 4;
  const int64_t n = kGroup * 64 * 1024;
  const std::vector<float> params = WeightLikeParameters(n, 2);
  const Gathered fp32 = GatherOnGloo(kGroup, params, {}, false);
  const Gathered fp8 = GatherOnGloo(kGroup, params, {{0, 512, 512}}, true);
  for (int r = 0; r < kGroup; ++r) {
    EXPECT_EQ(fp32.bytes[r], n / kGroup * 4);
    EXPECT_EQ(fp8.bytes[r], fp8.slot_bytes);
    EXPECT_EQ(fp8.bytes[r], n / kGroup);
    EXPECT_EQ(fp8.reduce_bytes[r], 16 * 4);
  }
  const double bf16_bytes = n / kGroup * 2.0;
  const double fp8_bytes = static_cast<double>(fp8.bytes[0] + fp8.reduce_bytes[0]);
  const double vs_bf16 = fp8_bytes / bf16_bytes, vs_fp32 = fp8_bytes / static_cast<double>(fp32.bytes[0]);
  std::printf("bytes per rank: fp32 gather %lld, bf16 %.0f, fp8 gather %lld + tile maxima %lld (%.4fx bf16, %.4fx fp32)\n",
              static_cast<long long>(fp32.bytes[0]), bf16_bytes, static_cast<long long>(fp8.bytes[0]),
              static_cast<long long>(fp8.reduce_bytes[0]), vs_bf16, vs_fp32);
  EXPECT_LE(vs_bf16, 0.5 * (1 + 1.0 / 1024));
  EXPECT_LE(vs_fp32, 0.25 * (1 + 1.0 / 1024));
  // No FP8 matrix: the slot is the fp32 shard, nothing is all-reduced.
  const Gathered none = GatherOnGloo(kGroup, params, {}, true);
  EXPECT_EQ(none.bytes[0], fp32.bytes[0]);
  EXPECT_EQ(none.reduce_bytes[0], 0);
  EXPECT_EQ(none.full[0], fp32.full[0]);
}

TEST(Fp8AllGatherTest, RejectsBadMatrices) {
  comm::InProcessKvStore store;
  auto comms = comm::ConnectGlooGroup(store, 1, comm::CommOptions());
  ASSERT_TRUE(comms.ok());
  const FlatShardLayout layout = FlatShardLayout::Make(100, 1);
  comm::Communicator* c = (*comms)[0].get();
  EXPECT_EQ(Fp8AllGather::Create(layout, c, {{10, 2, 5}, {15, 3, 5}}).status().code(),
            absl::StatusCode::kInvalidArgument);  // overlap
  EXPECT_EQ(Fp8AllGather::Create(layout, c, {{50, 2, 5}, {10, 2, 5}}).status().code(),
            absl::StatusCode::kInvalidArgument);  // unsorted
  EXPECT_EQ(Fp8AllGather::Create(layout, c, {{90, 1, 11}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Fp8AllGather::Create(layout, c, {{0, 0, 5}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Fp8AllGather::Create(layout, nullptr, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Fp8AllGather::Create(layout, c, {{0, 10, 10}}).ok());
}

}  // namespace
}  // namespace dist
}  // namespace recfleet
