#include "engine/job_model.h"

#include <functional>
#include <string>
#include <vector>

#include "data/synth.h"
#include "data/dataset_file.h"
#include "engine/model.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace recfleet::engine {
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
    dense { moe { num_experts: 2 top_k: 2 expert_hidden_dims: [ 16, 8 ] } }
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
  absl::StatusOr<JobModel> m = BuildJobModel(Spec());
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
  EXPECT_NE(BuildJobModel(spec).status().message().find("spec.model.tables[1].dim"), std::string::npos);
  spec = Spec();
  spec.mutable_model()->mutable_features(0)->set_table("nope");
  EXPECT_NE(BuildJobModel(spec).status().message().find("spec.model.features[0].table"), std::string::npos);
  spec = Spec();
  spec.mutable_model()->mutable_features()->DeleteSubrange(3, 1);
  EXPECT_NE(BuildJobModel(spec).status().message().find("SEQUENCE"), std::string::npos);
}

// Fields GEM-lite does not build are rejected by path, never dropped.
TEST(JobModelTest, RejectsWhatGemLiteDoesNotBuildYet) {
  struct Case {
    std::function<void(v1::JobSpec&)> change;
    std::string path;
  };
  const std::vector<Case> cases = {
      {[](v1::JobSpec& s) { s.mutable_model()->mutable_dense(1)->mutable_moe()->set_top_k(1); },
       "spec.model.dense[1].moe.top_k: not supported yet"},
      {[](v1::JobSpec& s) { s.mutable_model()->mutable_dense(0)->mutable_dcn()->set_low_rank(4); },
       "spec.model.dense[0].dcn.low_rank: not supported yet"},
      {[](v1::JobSpec& s) { s.mutable_model()->mutable_heads(0)->set_loss_weight(0.5); },
       "spec.model.heads[0].loss_weight: not supported yet"},
      {[](v1::JobSpec& s) { s.mutable_model()->mutable_heads(0)->add_hidden_dims(4); },
       "spec.model.heads[0].hidden_dims: not supported yet"},
      {[](v1::JobSpec& s) { s.mutable_model()->mutable_sequence()->mutable_attention()->set_bias(true); },
       "spec.model.sequence.attention.bias: not supported yet"},
      {[](v1::JobSpec& s) { s.mutable_model()->mutable_cross()->mutable_attention()->set_activation(v1::AttentionSpec::GELU); },
       "spec.model.cross.attention.activation: not supported yet"},
      {[](v1::JobSpec& s) { s.mutable_model()->mutable_tables(0)->set_learning_rate(0.1); },
       "spec.model.tables[0].learning_rate: not supported yet"},
  };
  for (const Case& c : cases) {
    v1::JobSpec spec = Spec();
    c.change(spec);
    const absl::Status s = BuildJobModel(spec).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.path;
    EXPECT_NE(s.message().find(c.path), std::string::npos) << s.message();
    EXPECT_NE(CheckBuildable(spec).message().find(c.path), std::string::npos) << c.path;
  }
  v1::JobSpec spec = Spec();
  spec.mutable_data()->set_micro_batches(2);
  EXPECT_NE(CheckBuildable(spec).message().find("spec.data.micro_batches: not supported yet"), std::string::npos);
  spec = Spec();
  spec.mutable_parallelism()->set_expert_parallel(true);
  EXPECT_NE(CheckBuildable(spec).message().find("spec.parallelism.expert_parallel: not supported yet"),
            std::string::npos);
  // GPU jobs: workers of one GPU each train (over NCCL when several); a
  // worker of several GPUs is refused by name.
  spec = Spec();
  spec.mutable_resources()->set_workers(1);
  spec.mutable_resources()->set_gpus_per_worker(1);
  EXPECT_TRUE(CheckBuildable(spec).ok()) << CheckBuildable(spec);
  spec.mutable_resources()->set_workers(4);
  EXPECT_TRUE(CheckBuildable(spec).ok()) << CheckBuildable(spec);
  spec.mutable_resources()->set_gpus_per_worker(2);
  EXPECT_NE(CheckBuildable(spec).message().find("spec.resources.gpus_per_worker: not supported yet above 1"),
            std::string::npos);
  EXPECT_TRUE(CheckBuildable(Spec()).ok()) << CheckBuildable(Spec());
}

// model.precision: the named modules' linear layers run FP8 on a GPU job;
// a recipe the engine cannot honor is refused by field, never dropped.
TEST(JobModelTest, PrecisionRecipeIsBuiltOrRefusedByField) {
  v1::JobSpec spec = Spec();
  spec.mutable_resources()->set_gpus_per_worker(1);
  v1::PrecisionRecipe* r = spec.mutable_model()->mutable_precision();
  r->add_fp8_modules("dcn");
  r->add_fp8_modules("moe.experts.l1");
  r->set_weight_gradient(v1::PrecisionRecipe::FP8);
  absl::StatusOr<JobModel> m = BuildJobModel(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.fp8.modules, (std::vector<std::string>{"dcn", "moe.experts.l1"}));
  EXPECT_TRUE(m->config.fp8.fp8_weight_gradients);
  EXPECT_TRUE(m->config.fp8.Holds("dcn0"));
  EXPECT_TRUE(m->config.fp8.Holds("moe.expert1.l1"));
  EXPECT_FALSE(m->config.fp8.Holds("moe.expert1.l2"));  // The late layer stays bf16.
  EXPECT_FALSE(m->config.fp8.Holds("moe.gate"));
  EXPECT_FALSE(m->config.fp8.Holds("ctr.l1"));
  EXPECT_FALSE(m->config.fp8.Holds("seq0.q"));
  EXPECT_TRUE(CheckBuildable(spec).ok()) << CheckBuildable(spec);
  EXPECT_NE(m->DebugString(), BuildJobModel(Spec())->DebugString());
  EXPECT_FALSE(m->config.fp8.wgrad_hadamard_stochastic);
  EXPECT_FALSE(m->config.fp8.Recipe().wgrad_hadamard);

  // FP8 weight gradients after the random Hadamard transform, dy rounded
  // stochastically: FP8 weight gradients with both options, and shown in
  // the plan text.
  r->set_weight_gradient(v1::PrecisionRecipe::FP8_HADAMARD_STOCHASTIC);
  absl::StatusOr<JobModel> hadamard = BuildJobModel(spec);
  ASSERT_TRUE(hadamard.ok()) << hadamard.status();
  EXPECT_TRUE(hadamard->config.fp8.wgrad_hadamard_stochastic);
  EXPECT_TRUE(hadamard->config.fp8.fp8_weight_gradients);
  const LinearRecipe recipe = hadamard->config.fp8.Recipe();
  EXPECT_EQ(recipe.wgrad, GemmPrecision::kFp8Block);
  EXPECT_TRUE(recipe.wgrad_hadamard);
  EXPECT_TRUE(recipe.wgrad_stochastic);
  EXPECT_TRUE(CheckBuildable(spec).ok()) << CheckBuildable(spec);
  EXPECT_NE(hadamard->DebugString().find("wgrad_hadamard_sr=1"), std::string::npos);
  EXPECT_NE(hadamard->DebugString(), m->DebugString());

  struct Case {
    std::function<void(v1::PrecisionRecipe&)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](v1::PrecisionRecipe& p) { p.add_fp8_modules("mlp"); },
       "spec.model.precision.fp8_modules[0] names no module: 'mlp'; one of dense_proj, dcn"},
      {[](v1::PrecisionRecipe& p) { p.add_fp8_modules("sequence"); },
       "spec.model.precision.fp8_modules[0]: not supported yet (FP8 inside the attention blocks"},
      {[](v1::PrecisionRecipe& p) {
         p.add_fp8_modules("moe.experts");
         p.add_fp8_modules("moe.experts.l2");
       },
       "spec.model.precision.fp8_modules[1] 'moe.experts.l2' repeats or overlaps 'moe.experts'"},
      {[](v1::PrecisionRecipe& p) {
         p.add_fp8_modules("towers");
         p.set_scale_granularity(v1::PrecisionRecipe::MX_32X32);
       },
       "spec.model.precision.scale_granularity: not supported yet"},
      {[](v1::PrecisionRecipe& p) { p.set_weight_gradient(v1::PrecisionRecipe::FP8); },
       "spec.model.precision.fp8_modules is empty, so scale_granularity, weight_gradient and all_gather apply "
       "to nothing"},
      {[](v1::PrecisionRecipe& p) { p.mutable_quality_gate()->set_max_relative_ne_increase(0.001); },
       "spec.model.precision.quality_gate has no low precision to check"},
      {[](v1::PrecisionRecipe& p) {
         p.add_fp8_modules("towers");
         p.mutable_quality_gate()->set_shadow_steps(10);
       },
       "spec.model.precision.quality_gate.max_relative_ne_increase must be > 0"},
      {[](v1::PrecisionRecipe& p) {
         p.add_fp8_modules("towers");
         p.mutable_quality_gate()->set_max_relative_ne_increase(0.001);
         p.mutable_quality_gate()->set_eval_samples(-1);
       },
       "spec.model.precision.quality_gate.eval_samples must be >= 0"},
      {[](v1::PrecisionRecipe& p) {
         p.add_fp8_modules("towers");
         p.mutable_quality_gate()->set_max_relative_ne_increase(0.001);
         p.mutable_quality_gate()->set_runs(17);
       },
       "spec.model.precision.quality_gate.runs must be in 0..16 (0 = 1), got 17"},
  };
  for (const Case& c : cases) {
    v1::JobSpec bad = Spec();
    bad.mutable_resources()->set_gpus_per_worker(1);
    c.change(*bad.mutable_model()->mutable_precision());
    const absl::Status st = BuildJobModel(bad).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(st.message().find(c.message), std::string::npos) << st.message();
  }
  // A module the model lacks: no DCN, no numeric features.
  v1::JobSpec no_dcn = Spec();
  no_dcn.mutable_model()->mutable_dense()->DeleteSubrange(0, 1);
  no_dcn.mutable_model()->mutable_precision()->add_fp8_modules("dcn");
  EXPECT_NE(BuildJobModel(no_dcn).status().message().find("names 'dcn' but spec.model.dense has no DCN module"),
            std::string::npos)
      << BuildJobModel(no_dcn).status();
  // FP8 on a CPU job: CreateJob refuses it (the CPU engine can emulate the
  // recipe's numerics for tests, far too slowly for a job).
  spec.mutable_resources()->set_gpus_per_worker(0);
  EXPECT_NE(CheckBuildable(spec).message().find("spec.model.precision.fp8_modules: FP8 GEMMs need a GPU job"),
            std::string::npos)
      << CheckBuildable(spec);
}

// model.precision.fp8_attention: the named attention blocks' forward runs
// the FP8 kernel on a GPU job with head dim 128; anything the kernel cannot
// take is refused by field.
TEST(JobModelTest, Fp8AttentionIsBuiltOrRefusedByField) {
  std::string text = kSynthSpec;
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"dim: 8 }", "dim: 128 }"}, {"model_dim: 8 num_heads: 2", "model_dim: 128 num_heads: 1"},
           {"pma_queries: 2 num_heads: 2", "pma_queries: 2 num_heads: 1"}}) {
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
      text.replace(at, from.size(), to);
    }
  }
  v1::JobSpec spec = Spec(text);
  spec.mutable_resources()->set_gpus_per_worker(1);
  v1::PrecisionRecipe* r = spec.mutable_model()->mutable_precision();
  r->add_fp8_attention("sequence");
  r->add_fp8_attention("pma");
  r->mutable_quality_gate()->set_max_relative_ne_increase(0.01);  // Attention alone is enough to gate.
  absl::StatusOr<JobModel> m = BuildJobModel(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.fp8.attention, (std::vector<std::string>{"sequence", "pma"}));
  EXPECT_TRUE(m->config.fp8.modules.empty());
  EXPECT_FALSE(m->config.fp8.empty());
  EXPECT_EQ(SequenceAttentionOptions(m->config).forward_precision, attention::ForwardPrecision::kFp8E4M3);
  EXPECT_EQ(m->config.fp8.AttentionPrecision("pma"), attention::ForwardPrecision::kFp8E4M3);
  EXPECT_EQ(m->config.fp8.AttentionPrecision("cross"), attention::ForwardPrecision::kBf16);
  EXPECT_FALSE(m->config.fp8.Holds("seq0.q"));  // The projections keep their precision.
  EXPECT_TRUE(CheckBuildable(spec).ok()) << CheckBuildable(spec);
  EXPECT_NE(m->DebugString().find("fp8_attention=sequence,pma fp8_attention_bwd=0"), std::string::npos)
      << m->DebugString();
  EXPECT_EQ(SequenceAttentionOptions(m->config).backward_precision, attention::BackwardPrecision::kBf16);
  // attention_backward FP8: the same blocks' backward too.
  r->set_attention_backward(v1::PrecisionRecipe::ATTENTION_BACKWARD_FP8);
  m = BuildJobModel(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(SequenceAttentionOptions(m->config).backward_precision, attention::BackwardPrecision::kFp8E4M3);
  EXPECT_EQ(m->config.fp8.AttentionBackwardPrecision("pma"), attention::BackwardPrecision::kFp8E4M3);
  EXPECT_EQ(m->config.fp8.AttentionBackwardPrecision("cross"), attention::BackwardPrecision::kBf16);
  EXPECT_NE(m->DebugString().find("fp8_attention_bwd=1"), std::string::npos) << m->DebugString();
  r->clear_attention_backward();

  struct Case {
    std::function<void(v1::ModelSpec&)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](v1::ModelSpec& s) { s.mutable_precision()->add_fp8_attention("seq"); },
       "spec.model.precision.fp8_attention[0] names no attention block: 'seq'; one of sequence, cross, pma"},
      {[](v1::ModelSpec& s) {
         s.mutable_precision()->add_fp8_attention("cross");
         s.mutable_precision()->add_fp8_attention("cross");
       },
       "spec.model.precision.fp8_attention[1] 'cross' is named twice"},
      {[](v1::ModelSpec& s) {
         s.mutable_cross()->set_pma_queries(0);
         s.mutable_precision()->add_fp8_attention("pma");
       },
       "spec.model.precision.fp8_attention[0] names 'pma' but the model has no PMA"},
      {[](v1::ModelSpec& s) {
         s.mutable_sequence()->set_num_heads(2);
         s.mutable_cross()->set_num_heads(2);
         s.mutable_precision()->add_fp8_attention("sequence");
       },
       "spec.model.precision.fp8_attention[0]: not supported yet (the FP8 attention kernel takes head dim 128 "
       "only; this model's is 64"},
      {[](v1::ModelSpec& s) {
         s.mutable_sequence()->mutable_attention()->set_activation(v1::AttentionSpec::SILU);
         s.mutable_precision()->add_fp8_attention("sequence");
       },
       "spec.model.precision.fp8_attention[0]: not supported yet (the FP8 attention kernel is softmax attention"},
      {[](v1::ModelSpec& s) {
         s.mutable_sequence()->mutable_attention()->set_kind(v1::AttentionSpec::BLOCK);
         s.mutable_precision()->add_fp8_attention("sequence");
       },
       "spec.model.precision.fp8_attention[0]: not supported yet (the FP8 attention kernel has no BLOCK mask"},
      {[](v1::ModelSpec& s) {
         s.mutable_precision()->set_attention_backward(v1::PrecisionRecipe::ATTENTION_BACKWARD_FP8);
       },
       "spec.model.precision.attention_backward is FP8 but fp8_attention names no block"},
  };
  for (const Case& c : cases) {
    v1::JobSpec bad = Spec(text);
    bad.mutable_resources()->set_gpus_per_worker(1);
    c.change(*bad.mutable_model());
    const absl::Status st = BuildJobModel(bad).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(st.message().find(c.message), std::string::npos) << st.message();
  }
  // A CPU job computes attention in fp32: refused at submit.
  spec.mutable_resources()->set_gpus_per_worker(0);
  spec.mutable_model()->mutable_precision()->clear_quality_gate();
  EXPECT_NE(CheckBuildable(spec).message().find(
                "spec.model.precision.fp8_attention: the FP8 attention kernel needs a GPU job"),
            std::string::npos)
      << CheckBuildable(spec);
}

// model.precision.all_gather: FP8 is the one part of the recipe a CPU job
// takes (its ranks gather those weights in FP8 and compute in fp32), and a
// GPU job takes it too; the quality gate needs a GPU job and is built with
// its defaults.
TEST(JobModelTest, Fp8AllGatherOnCpuJobsAndTheQualityGate) {
  v1::JobSpec spec = Spec();
  v1::PrecisionRecipe* r = spec.mutable_model()->mutable_precision();
  r->add_fp8_modules("dcn");
  r->set_all_gather(v1::PrecisionRecipe::ALL_GATHER_FP8);
  absl::StatusOr<JobModel> m = BuildJobModel(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->config.fp8.fp8_all_gather);
  EXPECT_FALSE(m->quality_gate.enabled());
  EXPECT_TRUE(CheckBuildable(spec).ok()) << CheckBuildable(spec);
  r->mutable_quality_gate()->set_max_relative_ne_increase(0.002);
  EXPECT_NE(CheckBuildable(spec).message().find("spec.model.precision.quality_gate: needs a GPU job"),
            std::string::npos)
      << CheckBuildable(spec);
  spec.mutable_resources()->set_gpus_per_worker(1);
  // GPU ranks gather FP8 over NCCL as well (and run the FP8 GEMMs).
  ASSERT_TRUE(CheckBuildable(spec).ok()) << CheckBuildable(spec);
  r->clear_all_gather();
  ASSERT_TRUE(CheckBuildable(spec).ok()) << CheckBuildable(spec);
  m = BuildJobModel(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->quality_gate.enabled());
  EXPECT_EQ(m->quality_gate.max_relative_ne_increase, 0.002);
  spec.mutable_resources()->set_workers(2);
  EXPECT_NE(CheckBuildable(spec).message().find("a job of several workers cannot run it yet"), std::string::npos)
      << CheckBuildable(spec);
  spec.mutable_resources()->set_workers(1);
  EXPECT_EQ(m->quality_gate.shadow_steps, 200);
  EXPECT_EQ(m->quality_gate.eval_samples, 65'536);
}

TEST(JobModelTest, DataConfigComesFromTheSpec) {
  v1::JobSpec spec = Spec();
  spec.mutable_data()->set_local_batch_size(256);
  spec.mutable_data()->mutable_bbs()->set_enabled(true);
  spec.mutable_data()->mutable_bbs()->set_base_batch_size(64);
  spec.mutable_data()->mutable_bbs()->mutable_cost_weights()->set_quadratic(0.5);
  absl::StatusOr<v1::DataConfig> c = BuildDataConfig(spec, "jobs/a", 4);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->job(), "jobs/a");
  EXPECT_EQ(c->dataset(), "unused");
  EXPECT_EQ(c->num_ranks(), 4);
  EXPECT_EQ(c->local_batch_size(), 256);
  EXPECT_EQ(c->base_batch_size(), 64);
  EXPECT_EQ(c->policy(), "recfleet");
  EXPECT_NE(c->cost_model().find("quadratic=0.5"), std::string::npos) << c->cost_model();
  EXPECT_EQ(c->seed(), 3u);
  spec.mutable_data()->mutable_bbs()->set_enabled(false);
  EXPECT_EQ(BuildDataConfig(spec, "jobs/a", 4)->policy(), "naive");
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
  absl::StatusOr<JobModel> m = BuildJobModel(Spec());
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
    if (n > 0) {
      EXPECT_EQ(b.sequence[0].ids[b.sequence[0].offsets[i + 1] - 1], rows->JaggedInt64(hist, pick[i])[n - 1] % 300);
    }
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
  absl::StatusOr<JobModel> m = BuildJobModel(spec);
  ASSERT_TRUE(m.ok());
  data::Schema schema;
  schema.features = {{"user_id", data::DType::kInt64, data::Layout::kScalar, "user"}};
  absl::Status s = BatchConverter::Create(*m, schema).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("item_id"), std::string::npos) << s;
}

// model.activation_memory: "sequence" recomputes every self-attention
// block; a budget takes the planner's choice from the plan (and fails
// without one); other regions, unknown names, repeats, both at once and a
// negative budget are refused naming the field.
TEST(JobModelTest, ActivationMemoryIsBuiltOrRefusedByField) {
  v1::JobSpec spec = Spec();
  spec.mutable_model()->mutable_sequence()->set_num_layers(3);
  absl::StatusOr<JobModel> plain = BuildJobModel(spec);
  ASSERT_TRUE(plain.ok()) << plain.status();
  using layers::BlockCheckpoint;
  using Modes = std::vector<BlockCheckpoint>;
  const BlockCheckpoint kNone = BlockCheckpoint::kNone, kNorm = BlockCheckpoint::kNorm,
                        kProj = BlockCheckpoint::kProjections, kBlock = BlockCheckpoint::kBlock;
  EXPECT_EQ(*AttentionCheckpointModes(*plain, nullptr), Modes(3, kNone));

  spec.mutable_model()->mutable_activation_memory()->add_recompute("sequence");
  absl::StatusOr<JobModel> all = BuildJobModel(spec);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->activation_memory.recompute_sequence);
  EXPECT_EQ(*AttentionCheckpointModes(*all, nullptr), Modes(3, kBlock));
  EXPECT_NE(all->DebugString(), plain->DebugString());
  // A level: every block at it; FP8-saved copies are the job's choice too.
  v1::JobSpec level = spec;
  level.mutable_model()->mutable_activation_memory()->set_recompute(0, "sequence.projections");
  level.mutable_model()->mutable_activation_memory()->set_fp8_saved(true);
  absl::StatusOr<JobModel> projections = BuildJobModel(level);
  ASSERT_TRUE(projections.ok()) << projections.status();
  EXPECT_EQ(*AttentionCheckpointModes(*projections, nullptr), Modes(3, kProj));
  EXPECT_TRUE(projections->activation_memory.fp8_saved);
  EXPECT_NE(projections->DebugString(), all->DebugString());
  // FP8-saved activations are low precision the quality gate can check on
  // their own; without them (or FP8 modules or attention) it has nothing.
  v1::JobSpec gated = level;
  gated.mutable_model()->mutable_precision()->mutable_quality_gate()->set_max_relative_ne_increase(0.01);
  absl::StatusOr<JobModel> gated_model = BuildJobModel(gated);
  ASSERT_TRUE(gated_model.ok()) << gated_model.status();
  EXPECT_TRUE(gated_model->quality_gate.enabled());
  gated.mutable_model()->mutable_activation_memory()->set_fp8_saved(false);
  EXPECT_NE(BuildJobModel(gated).status().message().find("quality_gate has no low precision to check"),
            std::string::npos);

  // The plan's levels: block l takes the deepest level recomputing it.
  v1::Plan plan;
  const int units[3] = {3, 2, 1};  // norm, projections, attention.
  for (int i = 0; i < 3; ++i) {
    v1::RegionCheckpointPlan* region = plan.add_checkpoint();
    region->set_region(kSequenceCheckpointRegions[i]);
    region->set_units(3);
    region->set_recomputed_units(units[i]);
  }
  v1::JobSpec budget = Spec();
  budget.mutable_model()->mutable_sequence()->set_num_layers(3);
  budget.mutable_model()->mutable_activation_memory()->set_budget_bytes(1 << 20);
  absl::StatusOr<JobModel> budgeted = BuildJobModel(budget);
  ASSERT_TRUE(budgeted.ok()) << budgeted.status();
  EXPECT_EQ(budgeted->activation_memory.budget_bytes, 1 << 20);
  EXPECT_EQ(*AttentionCheckpointModes(*budgeted, &plan), (Modes{kBlock, kProj, kNorm}));
  // The plan's choice holds without a budget too (HBM forced it).
  EXPECT_EQ(*AttentionCheckpointModes(*plain, &plan), (Modes{kBlock, kProj, kNorm}));
  EXPECT_EQ(AttentionCheckpointModes(*budgeted, nullptr).status().code(), absl::StatusCode::kFailedPrecondition);
  plan.mutable_checkpoint(1)->set_recomputed_units(4);
  EXPECT_EQ(AttentionCheckpointModes(*budgeted, &plan).status().code(), absl::StatusCode::kInvalidArgument);

  const std::vector<std::pair<std::function<void(v1::ActivationMemory*)>, std::string>> bad = {
      {[](v1::ActivationMemory* a) { a->add_recompute("dcn"); }, "activation_memory.recompute[0]: not supported yet"},
      {[](v1::ActivationMemory* a) { a->add_recompute("attention"); }, "recompute[0] names no region: 'attention'"},
      {[](v1::ActivationMemory* a) {
         a->add_recompute("sequence");
         a->add_recompute("sequence");
       },
       "recompute[1] repeats a sequence region ('sequence')"},
      {[](v1::ActivationMemory* a) {
         a->add_recompute("sequence.norm");
         a->add_recompute("sequence.attention");
       },
       "recompute[1] repeats a sequence region ('sequence.attention')"},
      {[](v1::ActivationMemory* a) {
         a->add_recompute("sequence");
         a->set_budget_bytes(100);
       },
       "budget_bytes and recompute are exclusive"},
      {[](v1::ActivationMemory* a) { a->set_budget_bytes(-1); }, "budget_bytes must be > 0 bytes (0: no budget)"},
  };
  for (const auto& [edit, message] : bad) {
    v1::JobSpec s = Spec();
    edit(s.mutable_model()->mutable_activation_memory());
    const absl::Status st = BuildJobModel(s).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_NE(st.message().find(message), std::string::npos) << st;
  }
  v1::JobSpec no_sequence = Spec();
  no_sequence.mutable_model()->clear_sequence();
  no_sequence.mutable_model()->mutable_activation_memory()->add_recompute("sequence");
  const absl::Status st = BuildJobModel(no_sequence).status();
  EXPECT_NE(st.message().find("names 'sequence' but spec.model has no sequence branch"), std::string::npos) << st;
}

}  // namespace
}  // namespace recfleet::engine
