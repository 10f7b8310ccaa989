#include "bench/e2e/synthetic_batches.h"

#include <algorithm>
#include <string>

#include "cli/jobs/spec_file.h"
#include "engine/job_model.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "gtest/gtest.h"
#include "services/coordinator/spec_validation.h"

namespace recfleet::bench {
namespace {

v1::JobSpec Load(const std::string& path) {
  absl::StatusOr<v1::JobSpec> spec = cli::LoadJobSpec(path);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

TEST(BenchConfigsTest, BothConfigsAreValidAndBuildable) {
  for (const char* path : {"bench/e2e/config_a.yaml", "bench/e2e/config_b.yaml"}) {
    const v1::JobSpec spec = Load(path);
    EXPECT_TRUE(coordinator::ValidateJobSpec(spec).ok()) << path << ": " << coordinator::ValidateJobSpec(spec);
    EXPECT_TRUE(engine::CheckBuildable(spec).ok()) << path << ": " << engine::CheckBuildable(spec);
  }
}

TEST(BenchConfigsTest, ConfigsHaveTheirStatedShape) {
  absl::StatusOr<engine::JobModel> a = engine::BuildJobModel(Load("bench/e2e/config_a.yaml"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->config.dim, 1024);
  EXPECT_EQ(a->config.dim / a->config.heads, 128);
  EXPECT_EQ(a->config.seq_layers, 4);
  EXPECT_EQ(a->sequence_max_length[0], 4096);
  EXPECT_FALSE(a->cvr_label.empty());
  absl::StatusOr<engine::JobModel> b = engine::BuildJobModel(Load("bench/e2e/config_b.yaml"));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->config.dim / b->config.heads, 128);
  EXPECT_EQ(b->sequence_max_length[0], 256);
  EXPECT_GE(b->config.expert_hidden, 4096);
  EXPECT_LE(b->config.expert_hidden, 8192);
}

TEST(SyntheticBatchesTest, HistoriesFollowTheSpecAndItsCap) {
  const v1::JobSpec spec = Load("bench/e2e/config_a.yaml");
  absl::StatusOr<SyntheticBatches> gen = SyntheticBatches::Create(spec, 7);
  ASSERT_TRUE(gen.ok()) << gen.status();
  EXPECT_EQ(gen->lengths().max, 4096);
  EXPECT_EQ(gen->lengths().min, 256);
  const engine::Batch b = gen->Next(1500);
  const engine::FeatureSchema& schema = gen->model().schema;
  ASSERT_EQ(b.sequence.size(), schema.sequence_fields.size());
  const std::vector<int64_t>& off = b.sequence[0].offsets;
  int64_t shortest = 1 << 30, longest = 0;
  for (size_t s = 1; s < off.size(); ++s) {
    shortest = std::min(shortest, off[s] - off[s - 1]);
    longest = std::max(longest, off[s] - off[s - 1]);
  }
  EXPECT_GE(shortest, 256);
  EXPECT_LE(longest, 4096);
  const double mean = static_cast<double>(off.back()) / b.size;
  EXPECT_GT(mean, 850);  // truncated Pareto(0.5) on [256, 4096]: about 1,024
  EXPECT_LT(mean, 1200);
  for (size_t f = 0; f < b.sequence.size(); ++f) {
    EXPECT_EQ(b.sequence[f].offsets, off);
    const int64_t rows = schema.tables[schema.sequence_fields[f].table].rows;
    for (int64_t id : b.sequence[f].ids) ASSERT_TRUE(id >= 0 && id < rows) << id;
  }
  // Zipf: the most popular item is row 0 and it is far above uniform.
  const int64_t zeros = std::count(b.sequence[0].ids.begin(), b.sequence[0].ids.end(), 0);
  EXPECT_GT(zeros, off.back() / 100);
  // CANDIDATE features have one id, ID_LIST features 1..kMaxIdListLength.
  for (size_t f = 0; f < b.id_lists.size(); ++f) {
    const bool candidate = gen->model().id_list_columns[f].rfind("item_", 0) == 0;
    for (int64_t s = 0; s < b.size; ++s) {
      const int64_t n = b.id_lists[f].offsets[s + 1] - b.id_lists[f].offsets[s];
      if (candidate) {
        ASSERT_EQ(n, 1) << gen->model().id_list_columns[f];
      } else {
        ASSERT_TRUE(n >= 1 && n <= kMaxIdListLength) << n;
      }
    }
  }
  EXPECT_EQ(b.dense.size(), static_cast<size_t>(b.size * schema.num_dense));
  ASSERT_EQ(b.ctr_labels.size(), static_cast<size_t>(b.size));
  ASSERT_EQ(b.cvr_labels.size(), static_cast<size_t>(b.size));
  double clicks = 0;
  for (int64_t s = 0; s < b.size; ++s) {
    clicks += b.ctr_labels[s];
    EXPECT_LE(b.cvr_labels[s], b.ctr_labels[s]);  // a conversion needs a click
  }
  EXPECT_GT(clicks, 0.1 * b.size);
  EXPECT_LT(clicks, 0.5 * b.size);
}

TEST(SyntheticBatchesTest, SameSeedSameBatches) {
  const v1::JobSpec spec = Load("bench/e2e/config_b.yaml");
  absl::StatusOr<SyntheticBatches> x = SyntheticBatches::Create(spec, 3);
  absl::StatusOr<SyntheticBatches> y = SyntheticBatches::Create(spec, 3);
  absl::StatusOr<SyntheticBatches> z = SyntheticBatches::Create(spec, 4);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok());
  const engine::Batch a = x->Next(64), b = y->Next(64), c = z->Next(64);
  EXPECT_EQ(a.sequence[0].ids, b.sequence[0].ids);
  EXPECT_EQ(a.dense, b.dense);
  EXPECT_NE(a.sequence[0].ids, c.sequence[0].ids);
  EXPECT_LE(a.sequence[0].offsets.back(), 64 * 256);
}

// The engine's own model trains on generated batches: they match the
// schema the model was built from (small example job, CPU engine).
TEST(SyntheticBatchesTest, EngineTrainsOnGeneratedBatches) {
  const v1::JobSpec spec = Load("deploy/examples/job-gemlite.yaml");
  absl::StatusOr<SyntheticBatches> gen = SyntheticBatches::Create(spec, 1);
  ASSERT_TRUE(gen.ok()) << gen.status();
  absl::StatusOr<std::unique_ptr<engine::GemLite<float>>> model =
      engine::GemLite<float>::Create(gen->model().config, gen->model().schema);
  ASSERT_TRUE(model.ok()) << model.status();
  for (int step = 0; step < 2; ++step) {
    absl::StatusOr<engine::StepResult> r = (*model)->ForwardBackward(gen->Next(16));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(r->ctr_loss, 0);
    EXPECT_GT(r->flops, 0);
    ASSERT_TRUE((*model)->ApplyUpdates().ok());
  }
}

TEST(SyntheticBatchesTest, RejectsDatasetsThatAreNotSynthetic) {
  v1::JobSpec spec = Load("deploy/examples/job-gemlite.yaml");
  spec.mutable_data()->set_dataset("file:///data/train");
  absl::StatusOr<SyntheticBatches> gen = SyntheticBatches::Create(spec, 1);
  EXPECT_EQ(gen.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gen.status().message().find("spec.data.dataset"), std::string::npos) << gen.status();
}

TEST(ModelJsonTest, NamesRoundTripThroughTheEngineParsers) {
  for (attention::Mask m : {attention::Mask::kNone, attention::Mask::kCausal, attention::Mask::kSlidingWindow,
                            attention::Mask::kBlock}) {
    absl::StatusOr<attention::Mask> parsed = engine::ParseMask(MaskName(m));
    ASSERT_TRUE(parsed.ok()) << MaskName(m);
    EXPECT_EQ(*parsed, m);
  }
  for (attention::Activation a :
       {attention::Activation::kSoftmax, attention::Activation::kGelu, attention::Activation::kSilu}) {
    absl::StatusOr<attention::Activation> parsed = engine::ParseAttentionActivation(AttentionActivationName(a));
    ASSERT_TRUE(parsed.ok()) << AttentionActivationName(a);
    EXPECT_EQ(*parsed, a);
  }
}

TEST(ModelJsonTest, CarriesTheConfigAndSchema) {
  absl::StatusOr<engine::JobModel> b = engine::BuildJobModel(Load("bench/e2e/config_b.yaml"));
  ASSERT_TRUE(b.ok());
  const std::string j = ModelJson(*b);
  for (const char* want :
       {"\"dim\": 256", "\"heads\": 2", "\"seq_mask\": \"block\"", "\"seq_activation\": \"silu\"", "\"rope\": true",
        "\"qk_norm\": true", "\"pma_queries\": 4", "\"dcn_layers\": 2", "\"num_experts\": 4",
        "\"expert_hidden\": 8192", "\"expert_out\": 1024", "\"tower_hidden\": 512", "\"mlp_activation\": \"relu\"",
        "\"learning_rate\": 0.0005,", "{\"name\": \"user_categories\", \"table\": 3, \"pooling\": \"mean\"}",
        "{\"name\": \"history_actions\", \"table\": 1}", "\"num_dense\": 64", "\"sequence_max_length\": 256",
        "\"cvr\": true", "\"attention_block_size\": 64", "\"rms_norm_epsilon\": 9.99"}) {
    EXPECT_NE(j.find(want), std::string::npos) << want << " not in\n" << j;
  }
}

}  // namespace
}  // namespace recfleet::bench
