#include "engine/model_spec.h"

#include <string>

#include "gtest/gtest.h"

namespace recfleet::engine {
namespace {

v1::ModelSpec GemLiteSpec() {
  v1::ModelSpec spec;
  for (const char* t : {"user", "item", "action"}) {
    v1::EmbeddingTable* table = spec.add_tables();
    table->set_name(t);
    table->set_rows(100);
    table->set_dim(8);
  }
  auto feature = [&](const std::string& name, v1::Feature::Kind kind, const std::string& table) {
    v1::Feature* f = spec.add_features();
    f->set_name(name);
    f->set_kind(kind);
    f->set_table(table);
    return f;
  };
  feature("user_id", v1::Feature::ID_LIST, "user");
  feature("genres", v1::Feature::ID_LIST, "item")->set_pooling(v1::MEAN);
  feature("candidate", v1::Feature::CANDIDATE, "item");
  feature("hist_item", v1::Feature::SEQUENCE, "item");
  feature("hist_action", v1::Feature::SEQUENCE, "action");
  v1::Feature* numeric = feature("counts", v1::Feature::NUMERIC, "");
  numeric->set_width(3);
  v1::SequenceBranch* seq = spec.mutable_sequence();
  seq->add_features("hist_item");
  seq->add_features("hist_action");
  seq->set_num_layers(2);
  seq->set_model_dim(8);
  seq->set_num_heads(2);
  seq->mutable_attention()->set_kind(v1::AttentionSpec::BLOCK);
  seq->mutable_attention()->set_activation(v1::AttentionSpec::SILU);
  seq->mutable_attention()->set_rope(true);
  spec.mutable_cross()->set_num_cross_layers(1);
  spec.mutable_cross()->set_pma_queries(4);
  spec.mutable_cross()->set_num_heads(2);
  spec.add_dense()->mutable_dcn()->set_num_layers(2);
  v1::MoeSpec* moe = spec.add_dense()->mutable_moe();
  moe->set_num_experts(3);
  moe->add_expert_hidden_dims(32);
  moe->add_expert_hidden_dims(16);
  v1::Head* head = spec.add_heads();
  head->set_kind(v1::Head::CTR);
  head->set_label("click");
  head->add_hidden_dims(8);
  return spec;
}

TEST(ModelSpecTest, MapsEveryPart) {
  v1::TrainingSpec training;
  training.set_dense_learning_rate(0.01);
  training.set_sparse_learning_rate(0.2);
  training.set_seed(9);
  FeatureSchema schema;
  GemLiteConfig c;
  ASSERT_TRUE(FromModelSpec(GemLiteSpec(), training, &schema, &c).ok());
  ASSERT_EQ(schema.tables.size(), 3u);
  EXPECT_EQ(schema.tables[1].name, "item");
  ASSERT_EQ(schema.id_lists.size(), 3u);
  EXPECT_EQ(schema.id_lists[1].pooling, Pooling::kMean);
  EXPECT_EQ(schema.id_lists[2].table, 1);
  ASSERT_EQ(schema.sequence_fields.size(), 2u);
  EXPECT_EQ(schema.sequence_fields[1].table, 2);
  EXPECT_EQ(schema.num_dense, 3);
  EXPECT_EQ(c.dim, 8);
  EXPECT_EQ(c.seq_layers, 2);
  EXPECT_EQ(c.seq_mask, attention::Mask::kBlock);
  EXPECT_EQ(c.seq_activation, attention::Activation::kSilu);
  EXPECT_TRUE(c.rope);
  EXPECT_TRUE(c.cross_attention);
  EXPECT_EQ(c.pma_queries, 4);
  EXPECT_EQ(c.dcn_layers, 2);
  EXPECT_EQ(c.num_experts, 3);
  EXPECT_EQ(c.expert_hidden, 32);
  EXPECT_EQ(c.expert_out, 16);
  EXPECT_EQ(c.tower_hidden, 8);
  EXPECT_DOUBLE_EQ(c.learning_rate, 0.01);
  EXPECT_DOUBLE_EQ(c.adagrad_learning_rate, 0.2);
  EXPECT_EQ(c.seed, 9u);
}

TEST(ModelSpecTest, NamesTheFieldItCannotBuild) {
  FeatureSchema schema;
  GemLiteConfig c;
  v1::ModelSpec topk = GemLiteSpec();
  topk.mutable_dense(1)->mutable_moe()->set_top_k(1);
  absl::Status s = FromModelSpec(topk, v1::TrainingSpec(), &schema, &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.message().find("model.dense[1].moe.top_k"), std::string::npos) << s.message();

  v1::ModelSpec bad_table = GemLiteSpec();
  bad_table.mutable_features(0)->set_table("nope");
  s = FromModelSpec(bad_table, v1::TrainingSpec(), &schema, &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("model.features[0].table"), std::string::npos) << s.message();

  v1::ModelSpec bias = GemLiteSpec();
  bias.mutable_sequence()->mutable_attention()->set_bias(true);
  EXPECT_EQ(FromModelSpec(bias, v1::TrainingSpec(), &schema, &c).code(),
            absl::StatusCode::kUnimplemented);

  v1::ModelSpec heads = GemLiteSpec();
  heads.mutable_sequence()->set_num_heads(3);
  EXPECT_EQ(FromModelSpec(heads, v1::TrainingSpec(), &schema, &c).code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace recfleet::engine
