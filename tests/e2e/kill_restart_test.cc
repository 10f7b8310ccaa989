// SIGKILL a worker mid-training (batches streamed by a data-loader; FSDP and
// tables sharded over both ranks): the coordinator notices within 10 s,
// restarts the job with a new epoch on the surviving worker and a
// replacement, every rank resumes from the last complete checkpoint, the
// job finishes, and the sample ids each rank trained (from the workers'
// sample logs) show that no sample was skipped or trained twice.

#include <string>

#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/e2e/local_cluster.h"

namespace recfleet::e2e {
namespace {

constexpr int kSteps = 200;
constexpr int kBatch = 32;
constexpr int kCheckpointEvery = 20;

TEST(KillRestartTest, JobSurvivesASigkilledWorkerWithoutSkippingOrRepeatingSamples) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/kill";
  ASSERT_TRUE(MakeSyntheticDataset(dir + "/data", 20000).ok());
  ClusterOptions options;
  options.dir = dir + "/cluster";
  options.lease_seconds = 3;
  options.loader = true;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;

  absl::StatusOr<v1::Job> created = c.CreateJob(ShardedTwoWorkerJobSpec(dir + "/data", dir + "/ckpt", kSteps, kCheckpointEvery, kBatch));
  ASSERT_TRUE(created.ok()) << created.status();
  const v1::Job job = *created;
  absl::StatusOr<v1::Job> running = c.WaitForJob(
      job.name(), [](const v1::Job& j) { return j.status().progress().step() >= 2 * kCheckpointEvery + 5; },
      absl::Seconds(60));
  ASSERT_TRUE(running.ok()) << running.status() << c.DumpLogs();
  ASSERT_LT(running->status().progress().step(), kSteps) << "the job finished before the kill; make it longer";

  const absl::Time killed = absl::Now();
  c.worker(1).Signal(SIGKILL);
  c.worker(1).Wait();
  // restart_epoch is 1 from the first placement; a restart increments it.
  const int64_t first_epoch = running->status().restart_epoch();
  absl::StatusOr<v1::Job> noticed = c.WaitForJob(
      job.name(), [&](const v1::Job& j) { return j.status().restart_epoch() > first_epoch; }, absl::Seconds(10));
  ASSERT_TRUE(noticed.ok()) << "restart not noticed within 10 s: " << noticed.status() << c.DumpLogs();
  const double detect_s = absl::ToDoubleSeconds(absl::Now() - killed);
  ASSERT_TRUE(c.AddWorker().ok());

  absl::StatusOr<v1::Job> done = c.WaitForJob(
      job.name(), [](const v1::Job& j) { return j.status().state() >= v1::JobStatus::SUCCEEDED; },
      absl::Seconds(80));
  ASSERT_TRUE(done.ok()) << done.status() << c.DumpLogs();
  ASSERT_EQ(done->status().state(), v1::JobStatus::SUCCEEDED) << done->DebugString() << c.DumpLogs();
  EXPECT_NE(done->status().plan_summary().find("FSDP 2 x 1"), std::string::npos) << done->status().plan_summary();
  std::printf("killed worker 1 at step %lld; restart noticed after %.2f s; finished at restart epoch %lld\n",
              static_cast<long long>(running->status().progress().step()), detect_s,
              static_cast<long long>(done->status().restart_epoch()));

  absl::Status once = c.CheckTrainedExactlyOnce(*done, {2, kSteps, kBatch, kCheckpointEvery, /*restarted=*/true});
  EXPECT_TRUE(once.ok()) << once;
}

}  // namespace
}  // namespace recfleet::e2e
