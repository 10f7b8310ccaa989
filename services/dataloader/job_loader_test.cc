#include "services/dataloader/job_loader.h"

#include <string>

#include "gtest/gtest.h"

namespace recfleet::dataloader {
namespace {

// A synthetic:// dataset lands under a name fixed by its URI alone, so every
// process that opens it (the loader, each worker's eval reader) finds the
// one copy instead of generating its own.
TEST(JobLoaderTest, SyntheticDatasetsHaveOneStableHome) {
  DatasetOptions o;
  o.cache_dir = std::string(testing::TempDir()) + "/synthetic";
  const std::string uri = "synthetic://t?samples=300&users=20&items=50&seed=2";
  absl::StatusOr<DatasetFiles> files = ResolveDataset(uri, o);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->train, o.cache_dir + "/e9754e5ba906685d/train.rfd");
  EXPECT_EQ(files->eval, o.cache_dir + "/e9754e5ba906685d/eval.rfd");
  absl::StatusOr<DatasetFiles> again = ResolveDataset(uri, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->train, files->train);
}

TEST(JobLoaderTest, BadLocationsSayWhatIsWrong) {
  DatasetOptions o;
  o.cache_dir = std::string(testing::TempDir()) + "/synthetic";
  EXPECT_EQ(ResolveDataset("", o).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status s = ResolveDataset("synthetic://t?samples=-3", o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("samples"), std::string::npos) << s;
  s = ResolveDataset("synthetic://t?colour=red", o).status();
  EXPECT_NE(s.message().find("unknown key 'colour'"), std::string::npos) << s;
  s = ResolveDataset("s3://bucket/x", o).status();
  EXPECT_NE(s.message().find("unknown scheme"), std::string::npos) << s;
  s = ResolveDataset("/no/such/place", o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("/no/such/place"), std::string::npos) << s;
  o.root = std::string(testing::TempDir());
  s = ResolveDataset("relative/dir", o).status();
  EXPECT_NE(s.message().find(o.root + "/relative/dir"), std::string::npos) << s;
}

TEST(JobLoaderTest, EvalFileComesFromEvalDatasetOrBesideTheTrainingData) {
  DatasetOptions o;
  o.cache_dir = std::string(testing::TempDir()) + "/synthetic";
  const std::string uri = "synthetic://t?samples=300&users=20&items=50&seed=2";
  const std::string home = o.cache_dir + "/e9754e5ba906685d";
  EXPECT_EQ(ResolveEvalFile(uri, "", o).value_or("?"), home + "/eval.rfd");
  // An explicit eval location wins: its eval.rfd, or the file it names.
  EXPECT_EQ(ResolveEvalFile("unused", uri, o).value_or("?"), home + "/eval.rfd");
  EXPECT_EQ(ResolveEvalFile("unused", home + "/train.rfd", o).value_or("?"), home + "/train.rfd");
  EXPECT_EQ(ResolveEvalFile(uri, "/no/eval/here", o).status().code(), absl::StatusCode::kNotFound);
  // A training location without an eval.rfd: no evaluation.
  EXPECT_EQ(ResolveEvalFile(home + "/train.rfd", "", o).value_or("?"), "");
}

}  // namespace
}  // namespace recfleet::dataloader
