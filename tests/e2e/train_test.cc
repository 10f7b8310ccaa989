// A coordinator, a data-loader and two worker daemons, separate processes
// on 127.0.0.1, train a small GEM-lite job end to end: the job succeeds, every step's
// samples are distinct across ranks, checkpoints are complete, the
// coordinator aggregates progress and evaluation, and the workers' /metrics
// count what they trained.

#include <set>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "data/synth.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/common/http_get.h"
#include "tests/e2e/local_cluster.h"
#include "worker/checkpoint.h"

namespace recfleet::e2e {
namespace {

constexpr int kSteps = 140;
constexpr int kBatch = 32;

// The value of an unlabelled series in Prometheus text, or -1.
double MetricValue(const std::string& text, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, name + " ")) {
      double v;
      if (absl::SimpleAtod(line.substr(name.size() + 1), &v)) return v;
    }
  }
  return -1;
}

// With a data-loader streaming the batches (the default deployment, here
// with TLS and bearer tokens on every connection, as a deployment runs),
// and with workers reading the dataset themselves (plain text on loopback).
class EndToEndTest : public ::testing::TestWithParam<bool> {};

TEST_P(EndToEndTest, TwoWorkersTrainASmallJob) {
  const bool with_loader = GetParam();
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + (with_loader ? "/loader" : "/direct");
  ASSERT_TRUE(MakeSyntheticDataset(dir + "/data", 12000).ok());
  ClusterOptions options;
  options.dir = dir + "/cluster";
  if (with_loader) {
    options.loader = true;
    options.tls = true;
  }
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;

  v1::CreateJobRequest create;
  *create.mutable_spec() = SmallJobSpec(dir + "/data", dir + "/ckpt", kSteps, 10, 2, kBatch);
  create.mutable_spec()->mutable_training()->set_eval_every(70);
  v1::Job job;
  {
    grpc::ClientContext ctx;
    grpc::Status s = c.jobs().CreateJob(&ctx, create, &job);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  absl::StatusOr<v1::Job> done = c.WaitForJob(
      job.name(), [](const v1::Job& j) { return j.status().state() >= v1::JobStatus::SUCCEEDED; },
      absl::Seconds(80));
  ASSERT_TRUE(done.ok()) << done.status() << "\n" << c.DumpLogs();
  ASSERT_EQ(done->status().state(), v1::JobStatus::SUCCEEDED) << done->DebugString() << c.DumpLogs();

  // The coordinator's job-level view.
  const v1::JobProgress& p = done->status().progress();
  EXPECT_EQ(p.step(), kSteps);
  EXPECT_EQ(p.samples(), int64_t{kSteps} * 2 * kBatch);
  EXPECT_EQ(p.eval_step(), kSteps);
  absl::StatusOr<double> best = data::PlantedAuc(dir + "/data/eval.rfd");
  ASSERT_TRUE(best.ok());
  std::printf("eval AUC %.4f NE %.4f (planted-model AUC %.4f)\n", p.eval_auc(), p.eval_ne(), *best);
  EXPECT_GT(p.eval_auc(), 0.55);
  EXPECT_LE(p.eval_auc(), *best + 0.02);

  // Checkpoints: the final step is complete, older ones pruned to two.
  absl::StatusOr<std::optional<int64_t>> latest = worker::LatestCompleteCheckpoint(dir + "/ckpt", 2);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->value_or(-1), kSteps);

  // Every rank trained every step once, and no sample twice.
  const std::string job_id = job.name().substr(5);
  absl::StatusOr<SampleLog> logs = ReadSampleLogs(c.sample_log_dir(), job_id);
  ASSERT_TRUE(logs.ok()) << logs.status();
  std::set<int64_t> seen;
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ((*logs)[rank].size(), 1u) << "one attempt expected";
    const auto& steps = (*logs)[rank].begin()->second;
    ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
    for (const auto& [step, ids] : steps) {
      ASSERT_EQ(ids.size(), static_cast<size_t>(kBatch));
      for (int64_t id : ids) EXPECT_TRUE(seen.insert(id).second) << "sample " << id << " trained twice";
    }
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kSteps * 2 * kBatch));

  // Each worker's /metrics counts its rank's samples and splits step time.
  for (const std::string& address : c.worker_metrics_addresses()) {
    absl::StatusOr<HttpGetResult> r = HttpGet(address, "/metrics");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(MetricValue(r->body, "recfleet_worker_samples_total"), kSteps * kBatch) << r->body;
    EXPECT_EQ(MetricValue(r->body, "recfleet_worker_step"), kSteps);
    EXPECT_NE(r->body.find("recfleet_worker_step_phase_seconds_total{phase=\"comm\"}"), std::string::npos);
    EXPECT_GT(MetricValue(r->body, "recfleet_worker_useful_flops_total"), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(DataPaths, EndToEndTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Loader" : "Direct"; });

}  // namespace
}  // namespace recfleet::e2e
