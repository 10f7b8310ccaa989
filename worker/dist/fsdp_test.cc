#include "worker/dist/fsdp.h"

#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/process_groups.h"
#include "worker/comm/testing.h"

namespace recfleet {
namespace dist {
namespace {

TEST(FlatShardLayoutTest, PadsToAMultipleOfTheGroup) {
  const FlatShardLayout l = FlatShardLayout::Make(10, 3);
  EXPECT_EQ(l.shard_numel, 4);
  EXPECT_EQ(l.padded_numel, 12);
  EXPECT_EQ(l.ShardOffset(2), 8);
  EXPECT_EQ(FlatShardLayout::Make(12, 3).padded_numel, 12);
  EXPECT_EQ(FlatShardLayout::Make(0, 4).shard_numel, 0);
}

// Six ranks: FSDP groups of 3 x 2 replicas, a parameter of 10 elements.
// Gather reassembles the shards; ReduceGradients gives each rank its shard of
// the sum (or mean) of all six ranks' gradients.
TEST(FsdpFlatParameterTest, GatherAndReduceOverGroupsAndReplicas) {
  auto mesh = comm::DeviceMesh::Create(6, {{"replica", 2}, {"fsdp", 3}});
  ASSERT_TRUE(mesh.ok());
  comm::InProcessKvStore store;
  comm::CommOptions options;
  options.timeout = absl::Seconds(20);
  constexpr int64_t kNumel = 10;
  comm::RunOnThreads(6, [&](int rank) {
    auto transport = comm::GlooTransport::Create("127.0.0.1");
    ASSERT_TRUE(transport.ok());
    auto groups = comm::ProcessGroups::Build(
        *mesh, rank, {{"fsdp"}, {"replica"}}, store,
        [&](comm::KvStore& s, int r, int n) { return comm::ConnectGloo(s, r, n, *transport, options); });
    ASSERT_TRUE(groups.ok()) << groups.status();
    comm::Communicator* g = groups->Get("fsdp");
    auto fsdp = FsdpFlatParameter::Create(kNumel, g, groups->Get("replica"));
    ASSERT_TRUE(fsdp.ok());
    EXPECT_EQ(fsdp->data_parallel_size(), 6);
    const FlatShardLayout l = fsdp->layout();

    std::vector<float> shard(l.shard_numel), full(l.padded_numel);
    for (int64_t i = 0; i < l.shard_numel; ++i) shard[i] = static_cast<float>(100 * g->rank() + i);
    ASSERT_TRUE(fsdp->AllGather(MakeView(shard.data(), DType::kFloat32, {l.shard_numel}),
                                MakeView(full.data(), DType::kFloat32, {l.padded_numel}))
                    .ok());
    for (int64_t i = 0; i < l.padded_numel; ++i) {
      EXPECT_EQ(full[i], static_cast<float>(100 * (i / l.shard_numel) + i % l.shard_numel));
    }

    // Rank r's gradient of element i is r + i (zero in the padding).
    std::vector<float> grad(l.padded_numel, 0.0f), shard_grad(l.shard_numel);
    for (int64_t i = 0; i < kNumel; ++i) grad[i] = static_cast<float>(rank + i);
    for (GradReduction red : {GradReduction::kSum, GradReduction::kMean}) {
      ASSERT_TRUE(fsdp->ReduceGradients(MakeView(grad.data(), DType::kFloat32, {l.padded_numel}),
                                        MakeView(shard_grad.data(), DType::kFloat32, {l.shard_numel}), red)
                      .ok());
      for (int64_t j = 0; j < l.shard_numel; ++j) {
        const int64_t i = l.ShardOffset(g->rank()) + j;
        const float sum = i < kNumel ? static_cast<float>(0 + 1 + 2 + 3 + 4 + 5 + 6 * i) : 0.0f;
        EXPECT_NEAR(shard_grad[j], red == GradReduction::kSum ? sum : sum / 6, 1e-5) << "rank " << rank << " i " << i;
      }
    }
    std::vector<float> wrong(l.shard_numel + 1);
    EXPECT_EQ(fsdp->AllGather(MakeView(wrong.data(), DType::kFloat32, {l.shard_numel + 1}),
                              MakeView(full.data(), DType::kFloat32, {l.padded_numel}))
                  .code(),
              absl::StatusCode::kInvalidArgument);
  });
}

}  // namespace
}  // namespace dist
}  // namespace recfleet
