#include "cli/jobs/spec_file.h"

#include <cstdio>
#include <fstream>

#include "engine/job_model.h"
#include "gtest/gtest.h"
#include "services/coordinator/spec_validation.h"

namespace recfleet::cli {
namespace {

std::string Write(const std::string& name, const std::string& text) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(SpecFileTest, ExampleJobLoadsAndIsValid) {
  absl::StatusOr<::recfleet::v1::JobSpec> spec = LoadJobSpec("deploy/examples/job-gemlite.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->display_name(), "gemlite-example");
  EXPECT_EQ(spec->model().tables_size(), 3);
  EXPECT_EQ(spec->model().sequence().attention().kind(), ::recfleet::v1::AttentionSpec::BLOCK);
  EXPECT_EQ(spec->model().dense(1).moe().num_experts(), 4);
  EXPECT_EQ(spec->labels().at("owner"), "example");
  EXPECT_EQ(spec->data().dataset().rfind("synthetic://gemlite?", 0), 0u);
  EXPECT_TRUE(coordinator::ValidateJobSpec(*spec).ok()) << coordinator::ValidateJobSpec(*spec);
  // What CreateJob checks on top: the example builds.
  EXPECT_TRUE(engine::CheckBuildable(*spec).ok()) << engine::CheckBuildable(*spec);
}

TEST(SpecFileTest, JsonAndCamelCaseAreAccepted) {
  std::string json = Write("job.json", R"({"display_name": "j", "resources": {"workers": 3},
      "model": {"tables": [{"name": "t", "rows": "10", "dim": 8}]}})");
  absl::StatusOr<::recfleet::v1::JobSpec> spec = LoadJobSpec(json);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->resources().workers(), 3);
  EXPECT_EQ(spec->model().tables(0).rows(), 10);
  std::string yaml = Write("camel.yaml", "displayName: c\ndata:\n  localBatchSize: 64\n");
  spec = LoadJobSpec(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data().local_batch_size(), 64);
}

struct Bad {
  const char* yaml;
  const char* message;
};

TEST(SpecFileTest, ErrorsNameLineAndFieldPath) {
  const Bad cases[] = {
      {"model:\n  tables:\n    - {name: a, dim: wide}\n",
       "bad.yaml:3: spec.model.tables[0].dim: expected an integer, got \"wide\""},
      {"model:\n  tabels: []\n", "bad.yaml:2: spec.model.tabels: unknown field; ModelSpec has"},
      {"model:\n  sequence:\n    attention: {kind: DIAGONAL}\n",
       "spec.model.sequence.attention.kind: expected one of FULL, SLIDING_WINDOW, BLOCK, got "
       "\"DIAGONAL\""},
      {"model: [1, 2]\n", "bad.yaml:1: spec.model: expected a mapping of fields, got a list"},
      {"model:\n  tables: {name: a}\n", "spec.model.tables: expected a list, got a mapping"},
      {"data:\n  bbs: {enabled: maybe}\n",
       "spec.data.bbs.enabled: expected true or false, got \"maybe\""},
      {"training: {steps: -5}\nresources: {workers: 1.5}\n",
       "spec.resources.workers: expected an integer, got \"1.5\""},
      {"model: {tables: [\n", "bad.yaml:2: not valid YAML"},
      {"", "bad.yaml: empty document"},
  };
  for (const Bad& c : cases) {
    absl::StatusOr<::recfleet::v1::JobSpec> spec = LoadJobSpec(Write("bad.yaml", c.yaml));
    ASSERT_FALSE(spec.ok()) << c.yaml;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(spec.status().message().find(c.message), std::string::npos)
        << "for:\n" << c.yaml << "got: " << spec.status().message();
  }
  EXPECT_EQ(LoadJobSpec("/nonexistent/job.yaml").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace recfleet::cli
