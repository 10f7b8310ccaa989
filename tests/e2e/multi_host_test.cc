// The coordinator, the data loader and three worker daemons, each on a
// "host" of its own (a network namespace on one bridge, test_network.h),
// with TLS and every credential on, as a deployment runs. A two-worker job
// trains across the hosts (FSDP and table shards over Gloo between worker
// hosts, batches streamed from the loader host). Mid-training the cable of
// one of its hosts is pulled: the coordinator notices the lost lease,
// restarts the job on the hosts still on the network (the third worker host
// idled until then: a job keeps its world size, so "the rest" needs a
// spare), the job finishes, and the sample logs show every sample trained
// exactly once.

#include <string>

#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/e2e/local_cluster.h"
#include "tests/e2e/test_network.h"

namespace recfleet::e2e {
namespace {

constexpr int kSteps = 300;  // long enough to be cut mid-run on a fast machine
constexpr int kBatch = 32;
constexpr int kCheckpointEvery = 10;

TEST(MultiHostTest, AJobSurvivesAHostCutOffTheNetworkWithoutSkippingOrRepeatingSamples) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/multi_host";
  absl::StatusOr<std::unique_ptr<TestNetwork>> net =
      TestNetwork::Create({"client", "coordinator", "loader", "worker0", "worker1", "worker2"});
  // Fails (never skips) where namespaces cannot be made: the reason says what is missing.
  ASSERT_TRUE(net.ok()) << "cannot build the multi-host test network: " << net.status();
  TestNetwork& n = **net;
  // This test's own calls (JobService) come from the "client" host.
  ASSERT_TRUE(n.Enter("client").ok());
  // One epoch covers the whole run (300 steps x 2 ranks x 32 = 19,200 training samples;
  // the generator holds 20% out for eval), so the exactly-once check below sees each
  // sample at most once.
  ASSERT_TRUE(MakeSyntheticDataset(dir + "/data", 25000).ok());

  ClusterOptions options;
  options.dir = dir + "/cluster";
  options.lease_seconds = 3;
  options.workers = 3;
  options.loader = true;
  options.tls = true;
  options.comm_timeout_seconds = 10;
  options.place = [&n](const std::string& process) {
    Placement p;
    p.exec_prefix = n.ExecPrefix(process);
    p.address = n.Address(process);
    return p;
  };
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  ASSERT_EQ(c.coordinator_address().rfind(n.Address("coordinator") + ":", 0), 0u) << c.coordinator_address();

  absl::StatusOr<v1::Job> created = c.CreateJob(ShardedTwoWorkerJobSpec(dir + "/data", dir + "/ckpt", kSteps, kCheckpointEvery, kBatch));
  ASSERT_TRUE(created.ok()) << created.status();
  const v1::Job job = *created;
  absl::StatusOr<v1::Job> running = c.WaitForJob(
      job.name(), [](const v1::Job& j) { return j.status().progress().step() >= 2 * kCheckpointEvery + 3; },
      absl::Seconds(60));
  ASSERT_TRUE(running.ok()) << running.status() << c.DumpLogs();
  ASSERT_LT(running->status().progress().step(), kSteps) << "the job finished before the cut; make it longer";

  // Pull the cable of the host holding the job's second worker.
  ASSERT_EQ(running->status().workers_size(), 2) << running->DebugString();
  int cut = -1;
  for (int i = 0; i < c.num_workers(); ++i) {
    if (c.worker_id(i) == running->status().workers(1)) cut = i;
  }
  ASSERT_GE(cut, 0) << running->DebugString();
  const std::string cut_host = absl::StrCat("worker", cut);
  const absl::Time pulled = absl::Now();
  ASSERT_TRUE(n.SetLink(cut_host, false).ok());
  // restart_epoch is 1 from the first placement; a restart increments it.
  const int64_t first_epoch = running->status().restart_epoch();
  absl::StatusOr<v1::Job> noticed = c.WaitForJob(
      job.name(), [&](const v1::Job& j) { return j.status().restart_epoch() > first_epoch; }, absl::Seconds(15));
  ASSERT_TRUE(noticed.ok()) << "cut not noticed within 15 s: " << noticed.status() << c.DumpLogs();
  const double detect_s = absl::ToDoubleSeconds(absl::Now() - pulled);

  absl::StatusOr<v1::Job> done = c.WaitForJob(
      job.name(), [](const v1::Job& j) { return j.status().state() >= v1::JobStatus::SUCCEEDED; },
      absl::Seconds(90));
  ASSERT_TRUE(done.ok()) << done.status() << c.DumpLogs();
  ASSERT_EQ(done->status().state(), v1::JobStatus::SUCCEEDED) << done->DebugString() << c.DumpLogs();
  for (const std::string& w : done->status().workers()) {
    EXPECT_NE(w, c.worker_id(cut)) << "the job finished on the host that was cut off";
  }
  std::printf("cut %s off at step %lld; restart noticed after %.2f s; finished at restart epoch %lld\n",
              cut_host.c_str(), static_cast<long long>(running->status().progress().step()), detect_s,
              static_cast<long long>(done->status().restart_epoch()));

  absl::Status once = c.CheckTrainedExactlyOnce(*done, {2, kSteps, kBatch, kCheckpointEvery, /*restarted=*/true});
  EXPECT_TRUE(once.ok()) << once;
}

}  // namespace
}  // namespace recfleet::e2e
