#include "worker/dist/fsdp_testing.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/testing.h"
#include "worker/dist/fsdp.h"

namespace recfleet {
namespace dist {
namespace {

// Waits for a started collective.
absl::Status Finish(absl::StatusOr<std::unique_ptr<comm::PendingCollective>> started) {
  if (!started.ok()) return started.status();
  return (*started)->Wait();
}

}  // namespace

void CheckFsdpGatherAndReduce(int world, int fsdp_size, comm::TestMemory& memory,
                              const std::function<comm::CommFactory(int rank)>& factory_for_rank) {
  auto mesh = comm::DeviceMesh::Create(world, {{"replica", world / fsdp_size}, {"fsdp", fsdp_size}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  comm::InProcessKvStore store;
  constexpr int64_t kNumel = 10;  // Not a multiple of most group sizes.
  comm::RunOnThreads(world, [&](int rank) {
    auto groups = comm::ProcessGroups::Build(*mesh, rank, {{"fsdp"}, {"replica"}}, store, factory_for_rank(rank));
    ASSERT_TRUE(groups.ok()) << groups.status();
    comm::Communicator* g = groups->Get("fsdp");
    auto fsdp = FsdpFlatParameter::Create(kNumel, g, groups->Get("replica"));
    ASSERT_TRUE(fsdp.ok()) << fsdp.status();
    EXPECT_EQ(fsdp->data_parallel_size(), world);
    const FlatShardLayout l = fsdp->layout();
    const size_t shard_bytes = l.shard_numel * sizeof(float);
    const size_t full_bytes = l.padded_numel * sizeof(float);
    void* shard_dev = memory.Alloc(rank, shard_bytes + 4);
    void* full_dev = memory.Alloc(rank, full_bytes + 4);
    auto shard_view = MakeView(shard_dev, DType::kFloat32, {l.shard_numel}, memory.device());
    auto full_view = MakeView(full_dev, DType::kFloat32, {l.padded_numel}, memory.device());

    // The blocking calls, then the started ones.
    for (bool started : {false, true}) {
      std::vector<float> shard(l.shard_numel), full(l.padded_numel);
      for (int64_t i = 0; i < l.shard_numel; ++i) shard[i] = static_cast<float>(100 * g->rank() + i);
      memory.Upload(rank, shard_dev, shard.data(), shard_bytes);
      absl::Status s = started ? Finish(fsdp->StartAllGather(shard_view, full_view))
                               : fsdp->AllGather(shard_view, full_view);
      ASSERT_TRUE(s.ok()) << s;
      memory.Download(rank, full.data(), full_dev, full_bytes);
      for (int64_t i = 0; i < l.padded_numel; ++i) {
        EXPECT_EQ(full[i], static_cast<float>(100 * (i / l.shard_numel) + i % l.shard_numel)) << "rank " << rank;
      }

      // Rank r's gradient of element i is r + i (zero in the padding).
      std::vector<float> grad(l.padded_numel, 0.0f), shard_grad(l.shard_numel);
      for (int64_t i = 0; i < kNumel; ++i) grad[i] = static_cast<float>(rank + i);
      for (GradReduction red : {GradReduction::kSum, GradReduction::kMean}) {
        memory.Upload(rank, full_dev, grad.data(), full_bytes);
        if (started) {
          auto scatter = fsdp->StartReduceScatter(full_view, shard_view, red);
          ASSERT_TRUE(scatter.ok()) << scatter.status();
          s = (*scatter)->Ready();
          ASSERT_TRUE(s.ok()) << s;
          s = Finish(fsdp->StartReplicaReduce(shard_view, red));
        } else {
          s = fsdp->ReduceGradients(full_view, shard_view, red);
        }
        ASSERT_TRUE(s.ok()) << s;
        memory.Download(rank, shard_grad.data(), shard_dev, shard_bytes);
        for (int64_t j = 0; j < l.shard_numel; ++j) {
          const int64_t i = l.ShardOffset(g->rank()) + j;
          const float sum = i < kNumel ? static_cast<float>(world * (world - 1) / 2 + world * i) : 0.0f;
          EXPECT_NEAR(shard_grad[j], red == GradReduction::kSum ? sum : sum / world, 1e-4)
              << "rank " << rank << " i " << i;
        }
      }
    }
    memory.Free(rank, shard_dev);
    memory.Free(rank, full_dev);
  });
}

}  // namespace dist
}  // namespace recfleet
