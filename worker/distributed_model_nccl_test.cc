// DistributedModel on a CUDA rank over NCCL (needs a GPU; tag gpu): the code
// the Gloo tests check on CPU ranks (distributed_model_test.cc), here with
// its FSDP units (prefetched on NCCL side streams, and blocking), sharded
// tables and pooled rows on the GPU and the CUDA engine on external tables,
// trains like the CPU reference model step for step (fp32). One rank: NCCL refuses two ranks on one GPU, and the
// engine's device allocator binds a process to one GPU, so several GPU ranks
// are several processes (the worker daemon's children), which the Gloo tests
// stand in for.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/testing/compare.h"
#include "engine/testing/movielens.h"
#include "engine/testing/synthetic.h"
#include "gtest/gtest.h"
#include "worker/comm/cuda_test_memory.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/dist/layout.h"
#include "worker/distributed_model.h"

namespace recfleet::worker {
namespace {

constexpr int kSteps = 30;
constexpr int64_t kBatch = 48;

engine::MovieLensCtr Data() {
  engine::SyntheticOptions s;
  s.num_users = 200;
  s.num_items = 300;
  engine::CtrOptions o;
  o.max_history = 48;
  return *engine::MovieLensCtr::Create(engine::SyntheticMovieLens(s), o);
}

// The samples of step s.
std::vector<int64_t> Samples(const engine::MovieLensCtr& data, int step) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < kBatch; ++i) out.push_back((step * kBatch + i) % data.num_train());
  return out;
}

std::vector<float> HostCopy(const TensorView& v) {
  std::vector<float> host(v.numel());
  EXPECT_EQ(cudaMemcpy(host.data(), v.data, v.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

// One GPU rank with FSDP and the tables over its (one-rank) NCCL groups
// trains kSteps, its FSDP units' collectives prefetched on the
// communicators' side streams or blocking; every step's loss and the final
// dense parameters are compared with the CPU model's.
// With `clip_factor` > 0 both clip the dense gradients' global norm at that
// multiple of the first step's (on the GPU rank: on the device, over its
// one-rank NCCL groups).
void ExpectTrainsLikeTheCpuModel(bool prefetch, double clip_factor = 0) {
  ASSERT_GE(comm::CudaDeviceCount(), 1) << "this test needs a GPU";
  const engine::MovieLensCtr data = Data();
  engine::GemLiteConfig config = engine::StepComparisonConfig();
  if (clip_factor > 0) {
    auto probe = engine::GemLite<float>::Create(config, data.schema());
    ASSERT_TRUE(probe.ok()) << probe.status();
    ASSERT_TRUE((*probe)->ForwardBackward(data.MakeBatch(false, Samples(data, 0))).ok());
    config.dense_grad_clip_norm = clip_factor * engine::DenseGradientNorm(**probe);
  }
  auto cpu = engine::GemLite<float>::Create(config, data.schema());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  std::vector<double> ref;
  for (int step = 0; step < kSteps; ++step) {
    auto r = (*cpu)->ForwardBackward(data.MakeBatch(false, Samples(data, step)));
    ASSERT_TRUE(r.ok()) << r.status();
    ref.push_back(r->ctr_loss);
    ASSERT_TRUE((*cpu)->ApplyUpdates().ok());
  }
  const std::vector<float> ref_dense = engine::FlatDenseParameters(**cpu);

  comm::InProcessKvStore store;
  const comm::CommFactory nccl = [](comm::KvStore& s, int r, int n) {
    return comm::ConnectNccl(s, r, n, /*cuda_device=*/0, comm::CommOptions());
  };
  comm::PrefixKvStore world_store(&store, "world/");
  auto world = nccl(world_store, 0, 1);
  ASSERT_TRUE(world.ok()) << world.status();
  auto layout = dist::ParallelLayout::FromHints(1, {});
  ASSERT_TRUE(layout.ok()) << layout.status();
  comm::PrefixKvStore group_store(&store, "groups/");
  auto groups = dist::TrainingGroups::Build(*layout, 0, group_store, nccl);
  ASSERT_TRUE(groups.ok()) << groups.status();
  // A CPU engine cannot run on NCCL groups' device buffers.
  EXPECT_EQ(DistributedModel::Create(config, data.schema(), &*groups, world->get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  engine::ExecutionOptions cuda;
  cuda.device = Device::kCuda;
  auto m = DistributedModel::Create(config, data.schema(), &*groups, world->get(), {}, cuda);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ((*m)->device(), Device::kCuda);
  ASSERT_TRUE((*m)->prefetch());
  (*m)->set_prefetch(prefetch);
  auto& tables = const_cast<dist::ShardedEmbeddingCollection&>((*m)->tables());
  for (int t : tables.plan().TablesOn(tables.group_rank())) EXPECT_EQ(tables.shard(t).device, Device::kCuda);

  double worst = 0;
  for (int step = 0; step < kSteps; ++step) {
    RankModel::Times times;
    auto r = (*m)->TrainStep(data.MakeBatch(false, Samples(data, step)), &times);
    ASSERT_TRUE(r.ok()) << "step " << step << ": " << r.status();
    const double rel = std::abs(r->ctr_loss - ref[step]) / std::abs(ref[step]);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-4) << "step " << step << ": cpu " << ref[step] << ", gpu rank " << r->ctr_loss;
  }
  ASSERT_TRUE((*m)->GatherDense().ok());
  std::vector<float> dense;
  for (const std::string& name : (*m)->engine_model().DenseParameterNames()) {
    const std::vector<float> v = HostCopy((*m)->engine_model().DenseParameter(name));
    dense.insert(dense.end(), v.begin(), v.end());
  }
  ASSERT_EQ(dense.size(), ref_dense.size());
  const double err = engine::MaxRelativeError(dense.data(), ref_dense.data(), ref_dense.size());
  EXPECT_LT(err, 1e-3);
  std::printf("1 gpu rank over nccl (prefetch %s, clip %.3g) vs the cpu model, %d steps of %lld: worst relative "
              "loss difference %.3g (first %.5f, last %.5f); dense parameters' max relative error %.3g\n",
              prefetch ? "on" : "off", config.dense_grad_clip_norm, kSteps, static_cast<long long>(kBatch), worst, ref.front(), ref.back(), err);
}

TEST(DistributedModelNcclTest, OneGpuRankTrainsLikeTheCpuModel) { ExpectTrainsLikeTheCpuModel(true); }

TEST(DistributedModelNcclTest, OneGpuRankWithoutPrefetchTrainsLikeTheCpuModel) {
  ExpectTrainsLikeTheCpuModel(false);
}

TEST(DistributedModelNcclTest, OneGpuRankWithGradientClippingTrainsLikeTheCpuModel) {
  ExpectTrainsLikeTheCpuModel(true, /*clip_factor=*/0.5);
}

}  // namespace
}  // namespace recfleet::worker
