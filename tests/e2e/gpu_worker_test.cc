// GPU workers (`recfleet-worker --device cuda`) end to end, on a machine
// with a CUDA device (tag gpu; not run by CPU CI):
//  - a one-GPU job trained by a GPU worker in fp32 ends with the parameters
//    a CPU worker trains on the same batches, within the engine's CUDA-vs-CPU
//    tolerance;
//  - a GPU worker killed with SIGKILL mid-training is replaced, the job
//    resumes from its last checkpoint, and the sample logs show no sample
//    skipped or trained twice.
// The harness is the CPU end-to-end tests' (local_cluster.h).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/e2e/local_cluster.h"
#include "worker/checkpoint.h"

namespace recfleet::e2e {
namespace {

constexpr int kBatch = 32;

const std::vector<std::string> kGpuFlags = {"--device=cuda", "--precision=fp32"};

v1::JobSpec OneGpuJob(const std::string& data, const std::string& ckpt, int64_t steps, int64_t every, int gpus) {
  v1::JobSpec spec = SmallJobSpec(data, ckpt, steps, every, /*workers=*/1, kBatch);
  spec.mutable_resources()->set_gpus_per_worker(gpus);
  // The engine's CUDA-vs-CPU test runs at rates 10x below the defaults:
  // AdamW and Adagrad divide small gradients by their own size, so fp32
  // summation-order noise grows at high rates (bench/RESULTS.md).
  spec.mutable_training()->set_dense_learning_rate(0.001);
  spec.mutable_training()->set_sparse_learning_rate(0.01);
  return spec;
}

absl::StatusOr<v1::Job> RunToEnd(LocalCluster& c, const v1::JobSpec& spec) {
  absl::StatusOr<v1::Job> created = c.CreateJob(spec);
  if (!created.ok()) return created.status();
  return c.WaitForJob(
      created->name(), [](const v1::Job& j) { return j.status().state() >= v1::JobStatus::SUCCEEDED; },
      absl::Seconds(120));
}

// The end of the flat dense vector a shard's slices cover.
int64_t DenseEnd(const worker::CheckpointShard& s) {
  int64_t end = 0;
  for (int slot : worker::DenseSlots(s)) {
    const std::optional<std::pair<int64_t, int64_t>> r =
        worker::RangeRecord(s, slot == 0 ? "dense.range" : absl::StrCat("dense.", slot, ".range"));
    if (r.has_value()) end = std::max(end, r->second);
  }
  return end;
}

// Max |x - y| / max |y| over two float arrays.
void Accumulate(const float* x, const float* y, size_t n, double* diff, double* norm) {
  for (size_t i = 0; i < n; ++i) {
    *diff = std::max(*diff, std::abs(static_cast<double>(x[i]) - y[i]));
    *norm = std::max(*norm, std::abs(static_cast<double>(y[i])));
  }
}

// Max |a - b| / max |b| over the final checkpoints' parameters: the flat
// dense vector (however the ranks' FSDP units sliced it: checkpoints are
// layout-independent) and every other float value record (the tables).
double CheckpointDifference(const worker::CheckpointShard& a, const worker::CheckpointShard& b) {
  double diff = 0, norm = 0;
  const int64_t end = std::max(DenseEnd(a), DenseEnd(b));
  std::vector<float> dense[2], m(end), v(end);
  const worker::CheckpointShard* shards[2] = {&a, &b};
  for (int i = 0; i < 2; ++i) {
    dense[i].assign(end, 0);
    absl::StatusOr<int64_t> copied = worker::RestoreDenseSlice({*shards[i]}, {0, end}, dense[i].data(), m.data(), v.data());
    EXPECT_TRUE(copied.ok() && *copied == end) << "dense values of checkpoint " << i << " cover "
                                               << (copied.ok() ? *copied : -1) << " of " << end;
    if (!copied.ok() || *copied != end) return 1;
  }
  Accumulate(dense[0].data(), dense[1].data(), end, &diff, &norm);
  for (const auto& [key, value] : b) {
    if (key.find(".value") == std::string::npos || absl::StartsWith(key, "dense")) continue;
    auto other = a.find(key);
    EXPECT_TRUE(other != a.end() && other->second.size() == value.size()) << key;
    if (other == a.end() || other->second.size() != value.size()) return 1;
    Accumulate(reinterpret_cast<const float*>(other->second.data()), reinterpret_cast<const float*>(value.data()),
               value.size() / sizeof(float), &diff, &norm);
  }
  return diff / std::max(norm, 1e-30);
}

TEST(GpuWorkerTest, OneGpuJobEndsWhereTheCpuReferenceDoes) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/equal";
  ASSERT_TRUE(MakeSyntheticDataset(dir + "/data", 4000).ok());
  constexpr int64_t kSteps = 30;
  worker::CheckpointShard final_shard[2];
  for (int gpu = 0; gpu < 2; ++gpu) {
    ClusterOptions options;
    options.dir = absl::StrCat(dir, "/cluster", gpu);
    options.workers = 1;
    if (gpu) options.worker_flags = kGpuFlags;
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    const std::string ckpt = absl::StrCat(dir, "/ckpt", gpu);
    absl::StatusOr<v1::Job> done = RunToEnd(**cluster, OneGpuJob(dir + "/data", ckpt, kSteps, 10, gpu));
    ASSERT_TRUE(done.ok()) << done.status() << (*cluster)->DumpLogs();
    ASSERT_EQ(done->status().state(), v1::JobStatus::SUCCEEDED) << done->DebugString() << (*cluster)->DumpLogs();
    if (gpu) {
      // It trained on the GPU, not on the CPU engine of the same binary.
      const std::string log = (*cluster)->DumpLogs();
      EXPECT_NE(log.find("trains on CUDA device"), std::string::npos) << log;
    }
    absl::StatusOr<worker::CheckpointShard> shard = worker::ReadCheckpointShard(ckpt, kSteps, 0, 1);
    ASSERT_TRUE(shard.ok()) << shard.status();
    final_shard[gpu] = *std::move(shard);
  }
  const double difference = CheckpointDifference(final_shard[1], final_shard[0]);
  std::printf("GPU (fp32) vs CPU worker after %lld steps: max parameter difference %.3g of the largest\n",
              static_cast<long long>(kSteps), difference);
  EXPECT_LT(difference, 1e-3);
}

TEST(GpuWorkerTest, SigkilledGpuWorkerResumesWithoutSkippingOrRepeatingSamples) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/kill";
  // Long enough that the kill lands mid-job: the coordinator publishes
  // progress about once a second, and the GPU trains this small model at a
  // few hundred steps a second (200 steps once finished before the first
  // publication). Within one epoch, so that a sample seen twice is an
  // error: 1,000 steps of 32 samples out of about 40,000 training samples
  // (each sample goes to the eval split with probability 0.2, so 40,000
  // samples in all left the training split a few dozen samples short of
  // 32,000 about half the time, and the last steps began a second epoch).
  ASSERT_TRUE(MakeSyntheticDataset(dir + "/data", 50000).ok());
  constexpr int64_t kSteps = 1000, kEvery = 20;
  ClusterOptions options;
  options.dir = dir + "/cluster";
  options.workers = 1;
  options.lease_seconds = 3;
  options.loader = true;
  options.worker_flags = kGpuFlags;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  absl::StatusOr<v1::Job> created = c.CreateJob(OneGpuJob(dir + "/data", dir + "/ckpt", kSteps, kEvery, 1));
  ASSERT_TRUE(created.ok()) << created.status();
  absl::StatusOr<v1::Job> running = c.WaitForJob(
      created->name(), [](const v1::Job& j) { return j.status().progress().step() >= 2 * kEvery + 5; },
      absl::Seconds(90));
  ASSERT_TRUE(running.ok()) << running.status() << c.DumpLogs();
  ASSERT_LT(running->status().progress().step(), kSteps) << "the job finished before the kill; make it longer";
  c.worker(0).Signal(SIGKILL);
  c.worker(0).Wait();
  ASSERT_TRUE(c.AddWorker().ok());
  absl::StatusOr<v1::Job> done = c.WaitForJob(
      created->name(), [](const v1::Job& j) { return j.status().state() >= v1::JobStatus::SUCCEEDED; },
      absl::Seconds(120));
  ASSERT_TRUE(done.ok()) << done.status() << c.DumpLogs();
  ASSERT_EQ(done->status().state(), v1::JobStatus::SUCCEEDED) << done->DebugString() << c.DumpLogs();
  std::printf("killed the GPU worker at step %lld; finished at restart epoch %lld\n",
              static_cast<long long>(running->status().progress().step()),
              static_cast<long long>(done->status().restart_epoch()));
  absl::Status once = c.CheckTrainedExactlyOnce(*done, {1, kSteps, kBatch, kEvery, /*restarted=*/true});
  EXPECT_TRUE(once.ok()) << once;
}

}  // namespace
}  // namespace recfleet::e2e
