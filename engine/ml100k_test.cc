// The small CI version of the ml-100k acceptance run (`recfleet train
// --local engine/examples/ml100k.yaml` is the full one): same split, same
// config, a few dozen steps. Skips when the shared data is absent.

#include <string>

#include "engine/local_job.h"
#include "engine/test_data.h"
#include "gtest/gtest.h"

namespace recfleet::engine {
namespace {

// 120 steps (about 31k samples, 40% of an epoch) must already beat the
// item-popularity baseline on the full held-out set.
TEST(Ml100kTest, ShortRunBeatsPopularity) {
  const std::string root = SharedDataDir("engine/ml100k_test.cc");
  if (root.empty()) GTEST_SKIP() << "shared/data not present";
  absl::StatusOr<LocalJob> job = LoadLocalJob("engine/examples/ml100k.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  job->dataset.path = root + "/ml-100k";
  job->train.max_steps = 120;
  job->train.threads = 2;
  job->train.log_every = 0;
  absl::StatusOr<LocalRunResult> r = RunLocalJob(*job, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->baselines.item_popularity, 0.7233, 1e-3);
  EXPECT_GT(r->report.final().eval.auc, r->baselines.item_popularity);
}

}  // namespace
}  // namespace recfleet::engine
