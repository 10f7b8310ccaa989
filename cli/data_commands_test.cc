// Drives the registered `recfleet data ...` commands end to end.

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/jobs/spec_file.h"
#include "data/cost_model.h"
#include "data/dataset_file.h"
#include "engine/job_model.h"
#include "gtest/gtest.h"

namespace recfleet::data {
namespace {

int RunCommand(const std::string& name, const std::vector<std::string>& args) {
  for (const cli::Command* c : cli::AllCommands()) {
    if (c->name == name) return c->run(args);
  }
  ADD_FAILURE() << "no command " << name;
  return -1;
}

TEST(DataCommandsTest, SynthInfoBalanceAndPlantedAuc) {
  std::string dir = std::string(testing::TempDir()) + "/cmd_synth";
  ASSERT_EQ(
      RunCommand("data synth", {"--out", dir, "--samples", "3000", "--lengths",
                                "lognormal:mean=60,sigma=1.2,min=1,max=2000", "--items", "2000"}),
      cli::kExitOk);
  EXPECT_EQ(RunCommand("data info", {"--dataset", dir, "--verify", "yes"}), cli::kExitOk);
  EXPECT_EQ(RunCommand("data balance-report", {"--dataset", dir, "--ranks", "4", "--batch-size",
                                               "256", "--cost", "quadratic"}),
            cli::kExitOk);
  // Fewer samples than one step of 8 x 1024: no step to report on, an error
  // rather than a table of zero gaps.
  EXPECT_EQ(RunCommand("data balance-report", {"--dataset", dir, "--ranks", "8", "--batch-size", "1024"}),
            cli::kExitUsage);
  EXPECT_EQ(RunCommand("data planted-auc", {"--dataset", dir + "/eval.rfd"}), cli::kExitOk);
}

TEST(DataCommandsTest, IngestSequencesAndUsageErrors) {
  std::string in = std::string(testing::TempDir()) + "/cmd_seq.txt";
  FILE* f = std::fopen(in.c_str(), "w");
  std::fputs("a x y z\nb y z w v\n", f);
  std::fclose(f);
  std::string out = std::string(testing::TempDir()) + "/cmd_seq";
  ASSERT_EQ(RunCommand("data ingest", {"--input", in, "--format", "sequences", "--out", out}),
            cli::kExitOk);
  auto train = ReadAll(out + "/train.rfd");
  ASSERT_TRUE(train.ok());
  EXPECT_GT(train->num_rows(), 0u);
  EXPECT_EQ(RunCommand("data ingest", {"--input", in}), cli::kExitUsage);
  EXPECT_EQ(RunCommand("data ingest", {"--bogus", "1"}), cli::kExitUsage);
  EXPECT_EQ(RunCommand("data balance-report", {"--dataset", out, "--batch-size", "100"}),
            cli::kExitUsage);
  EXPECT_EQ(RunCommand("data info", {"--dataset", out + "/missing.rfd"}), cli::kExitNotFound);
}

TEST(DataCommandsTest, CalibratePrintsCostWeights) {
  std::string spec = std::string(testing::TempDir()) + "/calibrate.yaml";
  FILE* f = std::fopen(spec.c_str(), "w");
  std::fputs(
      "model:\n"
      "  tables: [{name: item, rows: 50, dim: 8}]\n"
      "  features:\n"
      "    - {name: item_id, kind: CANDIDATE, table: item}\n"
      "    - {name: history_items, kind: SEQUENCE, table: item, max_length: 16}\n"
      "  sequence: {features: [history_items], num_layers: 1, model_dim: 8, num_heads: 2,\n"
      "             attention: {kind: FULL}}\n"
      "  cross: {num_cross_layers: 1, pma_queries: 2, num_heads: 2}\n"
      "  dense: [{mlp: {hidden_dims: [8, 8]}}]\n"
      "  heads: [{kind: CTR, label: label, hidden_dims: [8]}]\n"
      "data: {dataset: unused, local_batch_size: 4}\n"
      "resources: {workers: 1}\n"
      "training: {steps: 1, dense_learning_rate: 0.01, sparse_learning_rate: 0.01}\n",
      f);
  std::fclose(f);
  testing::internal::CaptureStdout();
  const int rc = RunCommand("data calibrate", {"--spec", spec, "--batch-size", "2", "--repeats", "1",
                                               "--fit-batches", "2", "--check-batches", "3"});
  const std::string out = testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, cli::kExitOk) << out;
  EXPECT_NE(out.find("held out, predicted vs measured:\n"), std::string::npos) << out;
  EXPECT_NE(out.find("3 batches: largest error"), std::string::npos) << out;
  // The printed snippet, pasted into the spec, is what the loader prices by.
  const std::string marker = "paste into the job spec:\n";
  ASSERT_NE(out.find(marker), std::string::npos) << out;
  v1::JobSpec weights;
  ASSERT_TRUE(
      cli::YamlToMessage(out.substr(out.find(marker) + marker.size()), "stdout", "spec", &weights)
          .ok())
      << out;
  const v1::BbsCostWeights& w = weights.data().bbs().cost_weights();
  for (double v : {w.per_sample(), w.linear(), w.quadratic()}) {
    EXPECT_TRUE(std::isfinite(v) && v >= 0) << v;
  }
  EXPECT_GT(w.per_sample() + w.linear() + w.quadratic(), 0);
  auto job = cli::LoadJobSpec(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  job->MergeFrom(weights);
  job->mutable_data()->mutable_bbs()->set_enabled(true);
  job->mutable_data()->set_local_batch_size(128);
  auto config = engine::BuildDataConfig(*job, "jobs/c", 2);
  ASSERT_TRUE(config.ok()) << config.status();
  auto cost = CostModel::Parse(config->cost_model());
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_NEAR(cost->per_sample, w.per_sample(), 1e-5 * w.per_sample());
  EXPECT_NEAR(cost->linear, w.linear(), 1e-5 * w.linear());
  EXPECT_NEAR(cost->quadratic, w.quadratic(), 1e-5 * w.quadratic());
  EXPECT_EQ(RunCommand("data calibrate", {"--spec", spec, "--lengths", "1,x"}), cli::kExitUsage);
  EXPECT_EQ(RunCommand("data calibrate", {}), cli::kExitUsage);
  // --sync-ranks belongs to --rates, and is checked before any probe runs.
  EXPECT_EQ(RunCommand("data calibrate", {"--spec", spec, "--sync-ranks", "2"}), cli::kExitUsage);
  const std::string rates = std::string(testing::TempDir()) + "/rates.yaml";
  EXPECT_EQ(RunCommand("data calibrate", {"--rates", rates, "--sync-ranks", "1"}), cli::kExitUsage);
  EXPECT_EQ(RunCommand("data calibrate", {"--rates", rates, "--device", "cuda", "--sync-ranks", "2"}),
            cli::kExitUsage);
}

}  // namespace
}  // namespace recfleet::data
