#include "services/common/data_grant.h"

#include "gtest/gtest.h"

namespace recfleet {
namespace {

v1::DataConfig Config(const std::string& job) {
  v1::DataConfig c;
  c.set_job(job);
  c.set_dataset("synthetic://a?samples=100");
  c.set_num_ranks(2);
  c.set_local_batch_size(32);
  c.set_base_batch_size(16);
  c.set_policy("recfleet");
  c.set_seed(7);
  return c;
}

TEST(DataGrantTest, TheGrantOfAConfigOpensThatConfig) {
  const std::string grant = SignDataGrant("key", Config("jobs/a"));
  EXPECT_EQ(grant.size(), 64u);
  EXPECT_TRUE(CheckDataGrant("key", Config("jobs/a"), grant).ok());
  // Deterministic: the loader recomputes the coordinator's grant.
  EXPECT_EQ(grant, SignDataGrant("key", Config("jobs/a")));
}

TEST(DataGrantTest, AnotherJobsGrantIsDenied) {
  const std::string grant_b = SignDataGrant("key", Config("jobs/b"));
  absl::Status s = CheckDataGrant("key", Config("jobs/a"), grant_b);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("jobs/a"), std::string::npos) << s;
  EXPECT_EQ(s.message().find(SignDataGrant("key", Config("jobs/a"))), std::string::npos)
      << "the error must not reveal the right grant";
}

TEST(DataGrantTest, AGrantDoesNotOpenAChangedConfigOfItsJob) {
  const std::string grant = SignDataGrant("key", Config("jobs/a"));
  v1::DataConfig other_data = Config("jobs/a");
  other_data.set_dataset("/data/someone-elses");
  EXPECT_EQ(CheckDataGrant("key", other_data, grant).code(), absl::StatusCode::kPermissionDenied);
  v1::DataConfig other_ranks = Config("jobs/a");
  other_ranks.set_num_ranks(3);
  EXPECT_EQ(CheckDataGrant("key", other_ranks, grant).code(), absl::StatusCode::kPermissionDenied);
}

TEST(DataGrantTest, MissingTruncatedOrOtherKeyGrantsAreDenied) {
  const std::string grant = SignDataGrant("key", Config("jobs/a"));
  EXPECT_EQ(CheckDataGrant("key", Config("jobs/a"), "").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(CheckDataGrant("key", Config("jobs/a"), grant.substr(0, 63)).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(CheckDataGrant("other-key", Config("jobs/a"), grant).code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace recfleet
