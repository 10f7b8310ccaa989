#include "services/coordinator/spec_validation.h"

#include <functional>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/coordinator/test_specs.h"

namespace recfleet::coordinator {
namespace {

using ::recfleet::v1::AttentionSpec;
using ::recfleet::v1::Feature;
using ::recfleet::v1::Head;
using ::recfleet::v1::JobSpec;

TEST(SpecValidationTest, ValidSpecPasses) {
  EXPECT_TRUE(ValidateJobSpec(ValidSpec()).ok()) << ValidateJobSpec(ValidSpec());
}

struct BadCase {
  const char* what;
  std::function<void(JobSpec&)> mutate;
  const char* message;  // Must appear verbatim in the error.
};

class BadSpecTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadSpecTest, RejectedWithFieldPath) {
  JobSpec spec = ValidSpec();
  GetParam().mutate(spec);
  absl::Status s = ValidateJobSpec(spec);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << GetParam().what;
  EXPECT_NE(s.message().find(GetParam().message), std::string::npos)
      << GetParam().what << ": got \"" << s.message() << "\"";
}

INSTANTIATE_TEST_SUITE_P(
    AllKinds, BadSpecTest,
    ::testing::Values(
        BadCase{"zero dim", [](JobSpec& s) { s.mutable_model()->add_tables()->set_name("t3");
                                            s.mutable_model()->mutable_tables(2)->set_rows(5); },
                "spec.model.tables[2].dim must be > 0, got 0"},
        BadCase{"dim not multiple of 4",
                [](JobSpec& s) { s.mutable_model()->mutable_tables(1)->set_dim(10); },
                "spec.model.tables[1].dim must be a multiple of 4, got 10"},
        BadCase{"negative rows",
                [](JobSpec& s) { s.mutable_model()->mutable_tables(0)->set_rows(-1); },
                "spec.model.tables[0].rows must be > 0, got -1"},
        BadCase{"duplicate table",
                [](JobSpec& s) { s.mutable_model()->mutable_tables(1)->set_name("items"); },
                "spec.model.tables[1].name must be unique among spec.model.tables, got \"items\""},
        BadCase{"bad table name",
                [](JobSpec& s) { s.mutable_model()->mutable_tables(0)->set_name("Items!"); },
                "spec.model.tables[0].name must be a non-empty name of [a-z0-9_], got \"Items!\""},
        BadCase{"no tables", [](JobSpec& s) { s.mutable_model()->clear_tables(); },
                "spec.model.tables must list at least one table, got none"},
        BadCase{"unknown table ref",
                [](JobSpec& s) { s.mutable_model()->mutable_features(1)->set_table("nope"); },
                "spec.model.features[1].table must name an entry of spec.model.tables, got \"nope\""},
        BadCase{"feature kind unset",
                [](JobSpec& s) {
                  s.mutable_model()->mutable_features(0)->set_kind(Feature::KIND_UNSPECIFIED);
                },
                "spec.model.features[0].kind must be one of NUMERIC, ID_LIST, SEQUENCE, "
                "CANDIDATE, got KIND_UNSPECIFIED"},
        BadCase{"numeric width",
                [](JobSpec& s) { s.mutable_model()->mutable_features(0)->set_width(0); },
                "spec.model.features[0].width must be > 0, got 0"},
        BadCase{"sequence max_length",
                [](JobSpec& s) { s.mutable_model()->mutable_features(2)->set_max_length(0); },
                "spec.model.features[2].max_length must be > 0, got 0"},
        BadCase{"pooling on sequence",
                [](JobSpec& s) {
                  s.mutable_model()->mutable_features(2)->set_pooling(::recfleet::v1::MEAN);
                },
                "spec.model.features[2].pooling applies only to ID_LIST features"},
        BadCase{"sequence refs non-sequence feature",
                [](JobSpec& s) { s.mutable_model()->mutable_sequence()->set_features(0, "user_id"); },
                "spec.model.sequence.features[0] must name a SEQUENCE feature of "
                "spec.model.features, got \"user_id\""},
        BadCase{"model_dim vs heads",
                [](JobSpec& s) { s.mutable_model()->mutable_sequence()->set_model_dim(66); },
                "spec.model.sequence.model_dim must be a multiple of num_heads (4), got 66"},
        BadCase{"window missing",
                [](JobSpec& s) {
                  s.mutable_model()->mutable_sequence()->mutable_attention()->set_kind(
                      AttentionSpec::SLIDING_WINDOW);
                },
                "spec.model.sequence.attention.window must be > 0, got 0"},
        BadCase{"block size",
                [](JobSpec& s) {
                  s.mutable_model()->mutable_sequence()->mutable_attention()->set_block_size(32);
                },
                "spec.model.sequence.attention.block_size must be 64 (or 0 for 64), got 32"},
        BadCase{"windowed cross attention",
                [](JobSpec& s) {
                  s.mutable_model()->mutable_cross()->mutable_attention()->set_kind(
                      AttentionSpec::BLOCK);
                },
                "spec.model.cross.attention.kind must be FULL for cross-attention"},
        BadCase{"cross without sequence",
                [](JobSpec& s) {
                  s.mutable_model()->clear_sequence();
                  s.mutable_model()->mutable_features(2)->set_kind(Feature::CANDIDATE);
                  s.mutable_model()->mutable_features(2)->clear_max_length();
                },
                "spec.model.cross needs spec.model.sequence (the history it attends to), got no "
                "sequence branch"},
        BadCase{"empty dense module",
                [](JobSpec& s) { s.mutable_model()->add_dense(); },
                "spec.model.dense[2] must set exactly one of mlp, dcn, moe, got none"},
        BadCase{"moe top_k",
                [](JobSpec& s) { s.mutable_model()->mutable_dense(1)->mutable_moe()->set_top_k(5); },
                "spec.model.dense[1].moe.top_k must be in [1, num_experts=4], got 5"},
        BadCase{"mlp width",
                [](JobSpec& s) {
                  auto* mlp = s.mutable_model()->add_dense()->mutable_mlp();
                  mlp->add_hidden_dims(64);
                  mlp->add_hidden_dims(-8);
                },
                "spec.model.dense[2].mlp.hidden_dims[1] must be > 0, got -8"},
        BadCase{"mlp activation",
                [](JobSpec& s) {
                  auto* mlp = s.mutable_model()->add_dense()->mutable_mlp();
                  mlp->add_hidden_dims(64);
                  mlp->set_activation("tanh");
                },
                "spec.model.dense[2].mlp.activation must be one of relu, gelu, silu, got \"tanh\""},
        BadCase{"duplicate head",
                [](JobSpec& s) { s.mutable_model()->mutable_heads(1)->set_kind(Head::CTR); },
                "spec.model.heads[1].kind must be unique among spec.model.heads, got CTR"},
        BadCase{"head label", [](JobSpec& s) { s.mutable_model()->mutable_heads(0)->clear_label(); },
                "spec.model.heads[0].label is required (the dataset's label column)"},
        BadCase{"no dataset", [](JobSpec& s) { s.mutable_data()->clear_dataset(); },
                "spec.data.dataset is required (a dataset directory or URI)"},
        BadCase{"batch size", [](JobSpec& s) { s.mutable_data()->set_local_batch_size(0); },
                "spec.data.local_batch_size must be > 0, got 0"},
        BadCase{"bbs base does not divide",
                [](JobSpec& s) { s.mutable_data()->set_local_batch_size(300); },
                "spec.data.bbs.base_batch_size must divide local_batch_size (300), got 128"},
        BadCase{"bbs negative weight",
                [](JobSpec& s) {
                  s.mutable_data()->mutable_bbs()->mutable_cost_weights()->set_linear(-1);
                },
                "spec.data.bbs.cost_weights.linear must be a finite number >= 0, got -1"},
        BadCase{"micro batches",
                [](JobSpec& s) { s.mutable_data()->set_micro_batches(3); },
                "spec.data.micro_batches must divide local_batch_size (256), got 3"},
        BadCase{"no workers", [](JobSpec& s) { s.mutable_resources()->set_workers(0); },
                "spec.resources.workers must be > 0, got 0"},
        BadCase{"fsdp group",
                [](JobSpec& s) { s.mutable_parallelism()->set_fsdp_group_size(3); },
                "spec.parallelism.fsdp_group_size must divide the world size (2), got 3"},
        BadCase{"fsdp x replicas",
                [](JobSpec& s) {
                  s.mutable_resources()->set_workers(4);
                  s.mutable_parallelism()->set_fsdp_group_size(2);
                  s.mutable_parallelism()->set_replicas(1);
                },
                "spec.parallelism fsdp_group_size * replicas must equal the world size (4), got "
                "2 * 1"},
        BadCase{"steps", [](JobSpec& s) { s.mutable_training()->set_steps(0); },
                "spec.training.steps must be > 0, got 0"},
        BadCase{"learning rate nan",
                [](JobSpec& s) { s.mutable_training()->set_dense_learning_rate(std::nan("")); },
                "spec.training.dense_learning_rate must be a finite number > 0, got nan"},
        BadCase{"gradient clip negative",
                [](JobSpec& s) { s.mutable_training()->set_dense_grad_clip_norm(-1); },
                "spec.training.dense_grad_clip_norm must be a finite number >= 0, got -1"},
        BadCase{"gradient clip nan",
                [](JobSpec& s) { s.mutable_training()->set_dense_grad_clip_norm(std::nan("")); },
                "spec.training.dense_grad_clip_norm must be a finite number >= 0, got nan"},
        BadCase{"gradient clip inf",
                [](JobSpec& s) {
                  s.mutable_training()->set_dense_grad_clip_norm(std::numeric_limits<double>::infinity());
                },
                "spec.training.dense_grad_clip_norm must be a finite number >= 0, got inf"},
        BadCase{"display name",
                [](JobSpec& s) { s.set_display_name(std::string(200, 'x')); },
                "spec.display_name must be at most 128 characters, got 200 characters"},
        BadCase{"too many labels",
                [](JobSpec& s) {
                  for (int i = 0; i < 65; ++i) (*s.mutable_labels())[absl::StrCat("k", i)] = "v";
                },
                "spec.labels must have at most 64 entries, got 65"},
        BadCase{"long label key",
                [](JobSpec& s) { (*s.mutable_labels())[std::string(64, 'k')] = "v"; },
                "spec.labels keys must be at most 63 bytes, got 64 bytes"},
        BadCase{"long label value",
                [](JobSpec& s) { (*s.mutable_labels())["team"] = std::string(257, 'v'); },
                "spec.labels[\"team\"] must be at most 256 bytes, got 257 bytes"},
        // Four valid 2 MB specs once made every ListJobs fail (over 4 MiB).
        BadCase{"oversized spec",
                [](JobSpec& s) {
                  for (int i = 0; i < 20000; ++i) {
                    auto* t = s.mutable_model()->add_tables();
                    t->set_name(absl::StrCat("table_", i));
                    t->set_rows(1000);
                    t->set_dim(16);
                  }
                },
                "spec must serialize to at most 262144 bytes (256 KiB), got "}));

TEST(SpecValidationTest, ReportsEveryViolationOfAnEmptySpec) {
  std::vector<std::string> v = SpecViolations(JobSpec());
  // Tables, features, heads, dataset, batch size, workers, steps, two learning rates.
  EXPECT_EQ(v.size(), 9u);
  EXPECT_EQ(v.front(), "spec.model.tables must list at least one table, got none");
}

TEST(SpecValidationTest, WorldSizeCountsGpus) {
  JobSpec s = ValidSpec(3);
  EXPECT_EQ(WorldSize(s), 3);
  s.mutable_resources()->set_gpus_per_worker(8);
  EXPECT_EQ(WorldSize(s), 24);
}

}  // namespace
}  // namespace recfleet::coordinator
