#include "engine/local_job.h"

#include "gtest/gtest.h"

namespace recfleet::engine {
namespace {

TEST(LocalJobTest, ExamplesParse) {
  absl::StatusOr<LocalJob> ml = LoadLocalJob("engine/examples/ml100k.yaml");
  ASSERT_TRUE(ml.ok()) << ml.status();
  EXPECT_EQ(ml->dataset.format, "movielens");
  EXPECT_EQ(ml->dataset.ctr.max_history, 30);
  EXPECT_EQ(ml->model.dim, 8);
  EXPECT_EQ(ml->model.seq_mask, attention::Mask::kNone);
  absl::StatusOr<LocalJob> syn = LoadLocalJob("engine/examples/synthetic.yaml");
  ASSERT_TRUE(syn.ok()) << syn.status();
  EXPECT_EQ(syn->dataset.format, "synthetic");
  EXPECT_EQ(syn->model.dim, 8);
}

TEST(LocalJobTest, ParsesEveryEnum) {
  absl::StatusOr<LocalJob> job = ParseLocalJob(R"(
dataset: {format: synthetic}
model: {seq_mask: sliding_window, seq_window: 4, seq_activation: silu, mlp_activation: gelu,
        qk_norm: true}
train: {threads: 2, batch_size: 7}
)");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->model.seq_mask, attention::Mask::kSlidingWindow);
  EXPECT_EQ(job->model.seq_window, 4);
  EXPECT_EQ(job->model.seq_activation, attention::Activation::kSilu);
  EXPECT_EQ(job->model.mlp_activation, Activation::kGelu);
  EXPECT_TRUE(job->model.qk_norm);
  EXPECT_EQ(job->train.threads, 2);
  EXPECT_EQ(job->train.batch_size, 7);
}

TEST(LocalJobTest, ErrorsNameTheKey) {
  // A valid dataset section, so the error comes from the part under test.
  auto message = [](const std::string& yaml) {
    return std::string(ParseLocalJob("dataset: {format: synthetic}\n" + yaml).status().message());
  };
  EXPECT_NE(message("model: {dimm: 3}").find("unknown key model.dimm"), std::string::npos);
  EXPECT_NE(message("model: {seq_mask: diagonal}").find("model.seq_mask"), std::string::npos);
  EXPECT_NE(message("model: {dim: many}").find("model.dim"), std::string::npos);
  EXPECT_NE(message("model: {dim: 6, heads: 4}").find("model.heads"), std::string::npos);
  EXPECT_NE(std::string(ParseLocalJob("dataset: {format: movielens}").status().message())
                .find("dataset.path"),
            std::string::npos);
  EXPECT_NE(message("trian: {}").find("trian"), std::string::npos);
  EXPECT_NE(message("train: [1, 2]").find("train must be a mapping"), std::string::npos);
  EXPECT_EQ(LoadLocalJob("no/such/job.yaml").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace recfleet::engine
