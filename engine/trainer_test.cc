#include "engine/trainer.h"

#include <string>
#include <vector>

#include "engine/local_job.h"
#include "engine/movielens.h"
#include "engine/synthetic.h"
#include "gtest/gtest.h"

namespace recfleet::engine {
namespace {

LocalJob SyntheticJob() {
  LocalJob job;
  job.dataset.format = "synthetic";
  job.dataset.synthetic.num_users = 150;
  job.dataset.synthetic.num_items = 150;
  job.dataset.synthetic.mean_extra_events = 20;
  job.dataset.ctr.max_history = 20;
  job.model.dim = 8;
  job.model.expert_hidden = 16;
  job.model.expert_out = 8;
  job.model.tower_hidden = 8;
  job.train.batch_size = 128;
  job.train.epochs = 3;
  job.train.log_every = 0;
  return job;
}

// The small always-on version of the ml-100k acceptance run: synthetic data
// with a planted signal; the model must learn it well beyond item popularity.
TEST(TrainerTest, LearnsSyntheticDataBeyondPopularity) {
  LocalJob job = SyntheticJob();
  job.train.threads = 2;
  absl::StatusOr<LocalRunResult> r = RunLocalJob(job, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  const EpochReport& last = r->report.final();
  EXPECT_EQ(r->report.epochs.size(), 3u);
  EXPECT_GT(last.eval.auc, r->baselines.item_popularity + 0.05);
  EXPECT_LT(last.eval.normalized_entropy, 0.9);
  EXPECT_LT(r->report.epochs.back().train_loss, r->report.epochs.front().train_loss);
  EXPECT_GT(r->report.flops, 0);
}

TEST(TrainerTest, DeterministicGivenSeedsAndThreads) {
  LocalJob job = SyntheticJob();
  job.train.epochs = 1;
  job.train.max_steps = 8;
  for (int threads : {1, 2}) {
    job.train.threads = threads;
    absl::StatusOr<LocalRunResult> a = RunLocalJob(job, nullptr);
    absl::StatusOr<LocalRunResult> b = RunLocalJob(job, nullptr);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->report.final().eval.log_loss, b->report.final().eval.log_loss) << threads;
    EXPECT_EQ(a->report.final().eval.auc, b->report.final().eval.auc) << threads;
  }
}

// Splitting a batch over replicas computes the same step as one model on
// the whole batch, up to float summation order.
TEST(TrainerTest, ThreadsMatchSingleThreadUpToRounding) {
  LocalJob job = SyntheticJob();
  job.train.epochs = 1;
  job.train.max_steps = 5;
  std::vector<double> loss;
  for (int threads : {1, 3}) {
    job.train.threads = threads;
    absl::StatusOr<LocalRunResult> r = RunLocalJob(job, nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
    loss.push_back(r->report.final().eval.log_loss);
  }
  EXPECT_NEAR(loss[0], loss[1], 1e-4);
}

TEST(TrainerTest, RejectsBadOptions) {
  LocalJob job = SyntheticJob();
  job.train.threads = 0;
  EXPECT_EQ(RunLocalJob(job, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recfleet::engine
