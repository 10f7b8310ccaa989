#include "worker/job_model.h"

#include <string>

#include "data/synth.h"
#include "data/dataset_file.h"
#include "engine/model.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace recfleet::worker {
namespace {

// A GEM-lite job over the columns `recfleet data synth` writes.
constexpr char kSynthSpec[] = R"pb(
  model {
    tables { name: "item" rows: 300 dim: 8 }
    tables { name: "user" rows: 50 dim: 8 }
    tables { name: "item_category" rows: 8 dim: 8 }
    features { name: "user_id" kind: ID_LIST table: "user" }
    features { name: "item_id" kind: CANDIDATE table: "item" }
    features { name: "item_category" kind: CANDIDATE table: "item_category" }
    features { name: "history_items" kind: SEQUENCE table: "item" max_length: 6 }
    features { name: "dense_0" kind: NUMERIC width: 1 }
    features { name: "dense_1" kind: NUMERIC width: 1 }
    sequence { features: "history_items" num_layers: 1 model_dim: 8 num_heads: 2 attention { kind: FULL rope: true } }
    cross { num_cross_layers: 1 pma_queries: 2 num_heads: 2 }
    dense { dcn { num_layers: 1 } }
    dense { moe { num_experts: 2 top_k: 1 expert_hidden_dims: [ 16, 8 ] } }
    heads { kind: CTR label: "label" hidden_dims: 8 }
  }
  data { dataset: "unused" local_batch_size: 16 }
  resources { workers: 1 }
  training { steps: 1 dense_learning_rate: 0.01 sparse_learning_rate: 0.05 seed: 3 }
)pb";

v1::JobSpec Spec(const std::string& text = kSynthSpec) {
  v1::JobSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &spec));
  return spec;
}

TEST(JobModelTest, MapsTheSpecOntoGemLite) {
  absl::StatusOr<JobModel> m = JobModelFromSpec(Spec());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->schema.tables.size(), 3u);
  EXPECT_EQ(m->schema.id_lists.size(), 3u);
  ASSERT_EQ(m->schema.sequence_fields.size(), 1u);
  EXPECT_EQ(m->schema.sequence_fields[0].table, 0);
  EXPECT_EQ(m->schema.num_dense, 2);
  EXPECT_EQ(m->config.dim, 8);
  EXPECT_EQ(m->config.heads, 2);
  EXPECT_EQ(m->config.num_experts, 2);
  EXPECT_EQ(m->config.expert_hidden, 16);
  EXPECT_EQ(m->config.expert_out, 8);
  EXPECT_EQ(m->config.pma_queries, 2);
  EXPECT_TRUE(m->config.cross_attention);
  EXPECT_EQ(m->ctr_label, "label");
  EXPECT_DOUBLE_EQ(m->config.learning_rate, 0.01);
}

TEST(JobModelTest, RejectsSpecsGemLiteCannotBuildNamingTheField) {
  v1::JobSpec spec = Spec();
  spec.mutable_model()->mutable_tables(1)->set_dim(16);
  EXPECT_NE(JobModelFromSpec(spec).status().message().find("spec.model.tables[1].dim"), std::string::npos);
  spec = Spec();
  spec.mutable_model()->mutable_features(0)->set_table("nope");
  EXPECT_NE(JobModelFromSpec(spec).status().message().find("spec.model.features[0].table"), std::string::npos);
  spec = Spec();
  spec.mutable_model()->mutable_features()->DeleteSubrange(3, 1);
  EXPECT_NE(JobModelFromSpec(spec).status().message().find("SEQUENCE"), std::string::npos);
}

TEST(JobModelTest, ConvertsSyntheticRowsIntoBatchesTheModelTrainsOn) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/synth";
  data::SynthOptions o;
  o.samples = 200;
  o.num_items = 1000;  // More ids than table rows: ids wrap modulo rows.
  o.num_users = 40;
  o.clusters = 8;
  o.dense_features = 2;
  o.lengths = *data::LengthDistribution::Parse("lognormal:mean=10,sigma=1,min=1,max=30");
  ASSERT_TRUE(data::GenerateSynthetic(o, dir).ok());
  absl::StatusOr<data::Batch> rows = data::ReadAll(dir + "/train.rfd");
  ASSERT_TRUE(rows.ok()) << rows.status();
  absl::StatusOr<JobModel> m = JobModelFromSpec(Spec());
  ASSERT_TRUE(m.ok());
  absl::StatusOr<BatchConverter> conv = BatchConverter::Create(*m, rows->schema());
  ASSERT_TRUE(conv.ok()) << conv.status();
  const std::vector<int64_t> pick = {0, 5, 7};
  engine::Batch b = conv->Convert(*rows, pick);
  ASSERT_EQ(b.size, 3);
  ASSERT_EQ(b.dense.size(), 6u);
  ASSERT_EQ(b.ctr_labels.size(), 3u);
  const int hist = rows->schema().Find("history_items");
  for (int i = 0; i < 3; ++i) {
    const int64_t n = static_cast<int64_t>(rows->RowLength(hist, pick[i]));
    const int64_t got = b.sequence[0].offsets[i + 1] - b.sequence[0].offsets[i];
    EXPECT_EQ(got, std::min<int64_t>(n, 6));  // max_length keeps the most recent events.
    if (n > 0) EXPECT_EQ(b.sequence[0].ids[b.sequence[0].offsets[i + 1] - 1], rows->JaggedInt64(hist, pick[i])[n - 1] % 300);
    EXPECT_EQ(b.id_lists[1].ids[i], rows->Int64(rows->schema().Find("item_id"), pick[i]) % 300);
  }
  EXPECT_EQ(conv->SampleId(*rows, 5), rows->Int64(rows->schema().Find("sample_id"), 5));
  auto model = engine::GemLite<float>::Create(m->config, m->schema);
  ASSERT_TRUE(model.ok()) << model.status();
  auto step = (*model)->ForwardBackward(conv->ConvertAll(*rows));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_GT(step->ctr_loss, 0);
}

TEST(JobModelTest, MissingColumnIsNamed) {
  v1::JobSpec spec = Spec();
  spec.mutable_model()->mutable_features(4)->set_name("dense_9");
  absl::StatusOr<JobModel> m = JobModelFromSpec(spec);
  ASSERT_TRUE(m.ok());
  data::Schema schema;
  schema.features = {{"user_id", data::DType::kInt64, data::Layout::kScalar, "user"}};
  absl::Status s = BatchConverter::Create(*m, schema).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("item_id"), std::string::npos) << s;
}

}  // namespace
}  // namespace recfleet::worker
