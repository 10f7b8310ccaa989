// SIGKILL a worker mid-training (batches streamed by a data-loader; FSDP and
// tables sharded over both ranks): the coordinator notices within 10 s,
// restarts the job with a new epoch on the surviving worker and a
// replacement, every rank resumes from the last complete checkpoint, the
// job finishes, and the sample ids each rank trained (from the workers'
// sample logs) show that no sample was skipped or trained twice.

#include <set>
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

  v1::CreateJobRequest create;
  *create.mutable_spec() = SmallJobSpec(dir + "/data", dir + "/ckpt", kSteps, kCheckpointEvery, 2, kBatch);
  // Dense parameters sharded over both ranks and tables split between them,
  // so the restart restores FSDP shards and table shards with their
  // optimizer state.
  create.mutable_spec()->mutable_parallelism()->set_fsdp_group_size(2);
  create.mutable_spec()->mutable_parallelism()->set_table_sharding_group_size(2);
  v1::Job job;
  {
    grpc::ClientContext ctx;
    grpc::Status s = c.jobs().CreateJob(&ctx, create, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  // Mid-training: past the first checkpoint, far from the end.
  absl::StatusOr<v1::Job> running = c.WaitForJob(
      job.name(), [](const v1::Job& j) { return j.status().progress().step() >= 2 * kCheckpointEvery + 5; },
      absl::Seconds(60));
  ASSERT_TRUE(running.ok()) << running.status() << c.DumpLogs();
  ASSERT_LT(running->status().progress().step(), kSteps) << "the job finished before the kill; make it longer";

  const absl::Time killed = absl::Now();
  c.worker(1).Signal(SIGKILL);
  c.worker(1).Wait();
  absl::StatusOr<v1::Job> noticed = c.WaitForJob(
      job.name(), [](const v1::Job& j) { return j.status().restart_epoch() >= 1; }, absl::Seconds(10));
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

  // Reconstruct what the final model was trained on: every step as trained
  // by the newest attempt that reached it.
  absl::StatusOr<SampleLog> logs = ReadSampleLogs(c.sample_log_dir(), job.name().substr(5));
  ASSERT_TRUE(logs.ok()) << logs.status();
  std::set<int64_t> seen;
  int64_t trained = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const auto& attempts = (*logs)[rank];
    ASSERT_GE(attempts.size(), 2u) << "rank " << rank << " was not restarted";
    for (auto it = std::next(attempts.begin()); it != attempts.end(); ++it) {
      if (it->second.empty()) continue;
      // A resumed attempt starts right after a checkpoint...
      const int64_t first = it->second.begin()->first;
      EXPECT_EQ((first - 1) % kCheckpointEvery, 0) << "rank " << rank << " epoch " << it->first << " resumed at " << first;
      // ...and replays exactly the samples the earlier attempt had there.
      for (const auto& [step, ids] : it->second) {
        for (auto prev = attempts.begin(); prev != it; ++prev) {
          auto same = prev->second.find(step);
          if (same != prev->second.end()) EXPECT_EQ(same->second, ids) << "rank " << rank << " step " << step;
        }
      }
    }
    for (int64_t step = 1; step <= kSteps; ++step) {
      const std::vector<int64_t>* ids = nullptr;
      for (const auto& [epoch, steps] : attempts) {
        auto s = steps.find(step);
        if (s != steps.end()) ids = &s->second;
      }
      ASSERT_NE(ids, nullptr) << "rank " << rank << " never trained step " << step;
      for (int64_t id : *ids) EXPECT_TRUE(seen.insert(id).second) << "sample " << id << " trained twice";
      trained += static_cast<int64_t>(ids->size());
    }
  }
  EXPECT_EQ(trained, int64_t{kSteps} * 2 * kBatch);
  EXPECT_EQ(seen.size(), static_cast<size_t>(trained));
}

}  // namespace
}  // namespace recfleet::e2e
