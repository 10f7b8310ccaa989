// Every JobSpec field is honored or rejected, never silently ignored.
//
// The test walks the JobSpec descriptor: each leaf field (paths without
// list indices, e.g. "model.tables.dim") must have a decision in kFields.
// An honored field, changed from the base spec, must pass CreateJob's checks
// and change what is built from the spec: the model (engine::JobModel), the
// data configuration the loader deals by (v1::DataConfig), the planner's
// request, or the training settings the rank's step loop and the
// coordinator read. A rejected field must fail CreateJob's checks with its
// path in the message. A new proto field without a decision fails the test.

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/job_model.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "services/coordinator/plan_adapter.h"
#include "services/coordinator/spec_validation.h"

namespace recfleet::coordinator {
namespace {

using ::recfleet::v1::JobSpec;
using Mutation = std::function<void(JobSpec&)>;

constexpr char kBase[] = R"pb(
  display_name: "fields"
  model {
    tables { name: "items" rows: 1000 dim: 32 }
    tables { name: "users" rows: 500 dim: 32 }
    features { name: "dense" kind: NUMERIC width: 3 }
    features { name: "user_id" kind: ID_LIST table: "users" }
    features { name: "history" kind: SEQUENCE table: "items" max_length: 64 }
    features { name: "ad_item" kind: CANDIDATE table: "items" }
    sequence { features: "history" num_layers: 1 model_dim: 32 num_heads: 4 attention { kind: FULL } }
    cross { num_cross_layers: 1 pma_queries: 2 num_heads: 4 }
    dense { dcn { num_layers: 1 } }
    dense { moe { num_experts: 2 top_k: 2 expert_hidden_dims: [ 64, 32 ] } }
    heads { kind: CTR label: "click" hidden_dims: 16 }
  }
  data { dataset: "data/train" local_batch_size: 256 bbs { enabled: true cost_weights { linear: 1 } } }
  resources { workers: 2 }
  training { steps: 100 dense_learning_rate: 0.001 sparse_learning_rate: 0.05 seed: 1 }
)pb";

JobSpec Base() {
  JobSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(kBase, &spec));
  return spec;
}

// CreateJob's checks.
absl::Status Check(const JobSpec& spec) {
  if (absl::Status s = ValidateJobSpec(spec); !s.ok()) return s;
  return engine::CheckBuildable(spec);
}

// Everything built from a spec that a run depends on.
std::string Built(const JobSpec& spec) {
  std::string out;
  absl::StatusOr<engine::JobModel> model = engine::BuildJobModel(spec);
  absl::StrAppend(&out, "model:\n", model.ok() ? model->DebugString() : std::string(model.status().message()));
  absl::StatusOr<v1::DataConfig> data = engine::BuildDataConfig(spec, "jobs/x", static_cast<int>(WorldSize(spec)));
  absl::StrAppend(&out, "data: ", data.ok() ? data->ShortDebugString() : std::string(data.status().message()), "\n");
  absl::StatusOr<planner::PlanRequest> plan = PlanRequestFromSpec(spec);
  if (plan.ok()) {
    absl::StrAppend(&out, "plan: ", plan->model.name, " batch ", plan->local_batch, " hints ",
                    plan->hints.fsdp_group_size, "/", plan->hints.replicas, "/", plan->hints.table_sharding_group_size,
                    " modules");
    for (const auto& m : plan->model.modules) absl::StrAppend(&out, " ", m.name, ":", m.params, ":", m.flops_per_sample);
    absl::StrAppend(&out, "\n");
  }
  // Read directly by the rank's step loop (rank_run.cc: steps, eval_every,
  // eval_batch_size, checkpoint_every, checkpoint_dir, eval_dataset) and by
  // the coordinator (max_restarts, labels, display_name).
  const auto& t = spec.training();
  absl::StrAppend(&out, "run: ", t.steps(), " ", t.eval_every(), " ", t.checkpoint_every(), " ", t.checkpoint_dir(),
                  " ", t.max_restarts(), " ", spec.data().eval_dataset(), " ", spec.data().eval_batch_size(), "\n");
  absl::StrAppend(&out, "job: ", spec.display_name());
  for (const auto& [k, v] : spec.labels()) absl::StrAppend(&out, " ", k, "=", v);
  return out;
}

enum class Decision { kHonored, kRejected };
struct Field {
  Decision decision;
  Mutation change;
  // Rejected: the path the error names (default "spec.<field path>").
  std::string error_path = "";
};

v1::ModelSpec& M(JobSpec& s) { return *s.mutable_model(); }
v1::AttentionSpec& SeqAtt(JobSpec& s) { return *M(s).mutable_sequence()->mutable_attention(); }
v1::AttentionSpec& CrossAtt(JobSpec& s) { return *M(s).mutable_cross()->mutable_attention(); }
v1::DataSpec& D(JobSpec& s) { return *s.mutable_data(); }
v1::TrainingSpec& T(JobSpec& s) { return *s.mutable_training(); }
v1::PrecisionRecipe& Fp8(JobSpec& s) { return *M(s).mutable_precision(); }
void GpuJob(JobSpec& s) {
  s.mutable_resources()->set_workers(1);
  s.mutable_resources()->set_gpus_per_worker(1);
}

// A GPU job whose attention blocks have one head of 128 (the FP8 attention
// kernel's head dim).
void HeadDim128(JobSpec& s) {
  GpuJob(s);
  for (auto& t : *M(s).mutable_tables()) t.set_dim(128);
  M(s).mutable_sequence()->set_model_dim(128);
  M(s).mutable_sequence()->set_num_heads(1);
  M(s).mutable_cross()->set_num_heads(1);
}

const Decision H = Decision::kHonored;
const Decision R = Decision::kRejected;

// The decision for every leaf field of JobSpec.
const std::map<std::string, Field>& Fields() {
  static const auto* fields = new std::map<std::string, Field>{
      {"display_name", {H, [](JobSpec& s) { s.set_display_name("other"); }}},
      {"labels", {H, [](JobSpec& s) { (*s.mutable_labels())["team"] = "ads"; }}},
      {"model.tables.name",
       {H, [](JobSpec& s) {
          M(s).mutable_tables(1)->set_name("people");
          M(s).mutable_features(1)->set_table("people");
        }}},
      {"model.tables.rows", {H, [](JobSpec& s) { M(s).mutable_tables(0)->set_rows(2000); }}},
      {"model.tables.dim",
       {H, [](JobSpec& s) {
          for (auto& t : *M(s).mutable_tables()) t.set_dim(16);
          M(s).mutable_sequence()->set_model_dim(16);
        }}},
      {"model.tables.learning_rate",
       {R, [](JobSpec& s) { M(s).mutable_tables(0)->set_learning_rate(0.1); }, "spec.model.tables[0].learning_rate"}},
      {"model.features.name",
       {H, [](JobSpec& s) { M(s).mutable_features(1)->set_name("uid"); }}},
      {"model.features.kind", {H, [](JobSpec& s) { M(s).mutable_features(1)->set_kind(v1::Feature::CANDIDATE); }}},
      {"model.features.width", {H, [](JobSpec& s) { M(s).mutable_features(0)->set_width(5); }}},
      {"model.features.table", {H, [](JobSpec& s) { M(s).mutable_features(3)->set_table("users"); }}},
      {"model.features.pooling", {H, [](JobSpec& s) { M(s).mutable_features(1)->set_pooling(v1::MEAN); }}},
      {"model.features.max_length", {H, [](JobSpec& s) { M(s).mutable_features(2)->set_max_length(16); }}},
      {"model.sequence.features",
       {H, [](JobSpec& s) {
          auto* f = M(s).add_features();
          f->set_name("actions");
          f->set_kind(v1::Feature::SEQUENCE);
          f->set_table("users");
          f->set_max_length(64);
          M(s).mutable_sequence()->add_features("actions");
        }}},
      {"model.sequence.num_layers", {H, [](JobSpec& s) { M(s).mutable_sequence()->set_num_layers(2); }}},
      {"model.sequence.model_dim",
       {R, [](JobSpec& s) { M(s).mutable_sequence()->set_model_dim(64); }, "spec.model.sequence.model_dim"}},
      {"model.sequence.num_heads",
       {H, [](JobSpec& s) {
          M(s).mutable_sequence()->set_num_heads(2);
          M(s).mutable_cross()->set_num_heads(2);
        }}},
      {"model.sequence.attention.kind", {H, [](JobSpec& s) { SeqAtt(s).set_kind(v1::AttentionSpec::BLOCK); }}},
      {"model.sequence.attention.window",
       {H, [](JobSpec& s) {
          SeqAtt(s).set_kind(v1::AttentionSpec::SLIDING_WINDOW);
          SeqAtt(s).set_window(8);
        }}},
      {"model.sequence.attention.block_size",
       {H, [](JobSpec& s) {
          SeqAtt(s).set_kind(v1::AttentionSpec::BLOCK);
          SeqAtt(s).set_block_size(64);
        }}},
      {"model.sequence.attention.rope", {H, [](JobSpec& s) { SeqAtt(s).set_rope(true); }}},
      {"model.sequence.attention.activation", {H, [](JobSpec& s) { SeqAtt(s).set_activation(v1::AttentionSpec::SILU); }}},
      {"model.sequence.attention.qk_norm", {H, [](JobSpec& s) { SeqAtt(s).set_qk_norm(true); }}},
      {"model.sequence.attention.bias",
       {R, [](JobSpec& s) { SeqAtt(s).set_bias(true); }, "spec.model.sequence.attention.bias"}},
      {"model.cross.num_cross_layers", {H, [](JobSpec& s) { M(s).mutable_cross()->set_num_cross_layers(0); }}},
      {"model.cross.pma_queries", {H, [](JobSpec& s) { M(s).mutable_cross()->set_pma_queries(3); }}},
      {"model.cross.num_heads",
       {R, [](JobSpec& s) { M(s).mutable_cross()->set_num_heads(2); }, "spec.model.cross.num_heads"}},
      {"model.cross.attention.kind",
       {R, [](JobSpec& s) { CrossAtt(s).set_kind(v1::AttentionSpec::BLOCK); }, "spec.model.cross.attention.kind"}},
      {"model.cross.attention.window",
       {R, [](JobSpec& s) { CrossAtt(s).set_window(8); }, "spec.model.cross.attention.window"}},
      {"model.cross.attention.block_size",
       {R, [](JobSpec& s) { CrossAtt(s).set_block_size(64); }, "spec.model.cross.attention.block_size"}},
      {"model.cross.attention.rope", {R, [](JobSpec& s) { CrossAtt(s).set_rope(true); }, "spec.model.cross.attention.rope"}},
      {"model.cross.attention.activation",
       {R, [](JobSpec& s) { CrossAtt(s).set_activation(v1::AttentionSpec::GELU); }, "spec.model.cross.attention.activation"}},
      {"model.cross.attention.qk_norm",
       {R, [](JobSpec& s) { CrossAtt(s).set_qk_norm(true); }, "spec.model.cross.attention.qk_norm"}},
      {"model.cross.attention.bias", {R, [](JobSpec& s) { CrossAtt(s).set_bias(true); }, "spec.model.cross.attention.bias"}},
      {"model.dense.name", {H, [](JobSpec& s) { M(s).mutable_dense(1)->set_name("experts"); }}},
      {"model.dense.mlp.hidden_dims",
       {H, [](JobSpec& s) {
          auto* mlp = M(s).mutable_dense(1)->mutable_mlp();  // Replaces the moe (oneof).
          mlp->add_hidden_dims(48);
          mlp->add_hidden_dims(24);
        }}},
      {"model.dense.mlp.activation",
       {H, [](JobSpec& s) {
          auto* mlp = M(s).mutable_dense(1)->mutable_mlp();
          mlp->add_hidden_dims(64);
          mlp->add_hidden_dims(32);
          mlp->set_activation("gelu");
        }}},
      {"model.dense.dcn.num_layers", {H, [](JobSpec& s) { M(s).mutable_dense(0)->mutable_dcn()->set_num_layers(3); }}},
      {"model.dense.dcn.low_rank",
       {R, [](JobSpec& s) { M(s).mutable_dense(0)->mutable_dcn()->set_low_rank(8); }, "spec.model.dense[0].dcn.low_rank"}},
      {"model.dense.moe.num_experts",
       {H, [](JobSpec& s) {
          M(s).mutable_dense(1)->mutable_moe()->set_num_experts(3);
          M(s).mutable_dense(1)->mutable_moe()->set_top_k(3);
        }}},
      {"model.dense.moe.top_k",
       {R, [](JobSpec& s) { M(s).mutable_dense(1)->mutable_moe()->set_top_k(1); }, "spec.model.dense[1].moe.top_k"}},
      {"model.dense.moe.expert_hidden_dims",
       {H, [](JobSpec& s) { M(s).mutable_dense(1)->mutable_moe()->set_expert_hidden_dims(0, 96); }}},
      {"model.heads.kind", {H, [](JobSpec& s) { M(s).mutable_heads(0)->set_kind(v1::Head::CVR); }}},
      {"model.heads.label", {H, [](JobSpec& s) { M(s).mutable_heads(0)->set_label("clicked"); }}},
      {"model.heads.hidden_dims", {H, [](JobSpec& s) { M(s).mutable_heads(0)->set_hidden_dims(0, 8); }}},
      // The precision recipe is for GPU jobs (CreateJob refuses FP8 on CPU
      // workers), so each change also makes the job one GPU worker.
      {"model.precision.fp8_modules",
       {H, [](JobSpec& s) {
          GpuJob(s);
          Fp8(s).add_fp8_modules("dcn");
        }}},
      {"model.precision.weight_gradient",
       {H, [](JobSpec& s) {
          GpuJob(s);
          Fp8(s).add_fp8_modules("dcn");
          Fp8(s).set_weight_gradient(v1::PrecisionRecipe::FP8);
        }}},
      // The FP8 all-gather is the one piece of the recipe a CPU job takes.
      {"model.precision.all_gather",
       {H, [](JobSpec& s) {
          Fp8(s).add_fp8_modules("dcn");
          Fp8(s).set_all_gather(v1::PrecisionRecipe::ALL_GATHER_FP8);
        }}},
      {"model.precision.quality_gate.max_relative_ne_increase",
       {H, [](JobSpec& s) {
          GpuJob(s);
          Fp8(s).add_fp8_modules("dcn");
          Fp8(s).mutable_quality_gate()->set_max_relative_ne_increase(0.001);
        }}},
      {"model.precision.quality_gate.shadow_steps",
       {H, [](JobSpec& s) {
          GpuJob(s);
          Fp8(s).add_fp8_modules("dcn");
          Fp8(s).mutable_quality_gate()->set_max_relative_ne_increase(0.001);
          Fp8(s).mutable_quality_gate()->set_shadow_steps(50);
        }}},
      {"model.precision.quality_gate.eval_samples",
       {H, [](JobSpec& s) {
          GpuJob(s);
          Fp8(s).add_fp8_modules("dcn");
          Fp8(s).mutable_quality_gate()->set_max_relative_ne_increase(0.001);
          Fp8(s).mutable_quality_gate()->set_eval_samples(4096);
        }}},
      {"model.precision.quality_gate.runs",
       {H, [](JobSpec& s) {
          GpuJob(s);
          Fp8(s).add_fp8_modules("dcn");
          Fp8(s).mutable_quality_gate()->set_max_relative_ne_increase(0.001);
          Fp8(s).mutable_quality_gate()->set_runs(3);
        }}},
      // The FP8 attention kernel takes head dim 128 only.
      {"model.precision.fp8_attention", {H, [](JobSpec& s) {
                                           HeadDim128(s);
                                           Fp8(s).add_fp8_attention("sequence");
                                         }}},
      {"model.precision.attention_backward",
       {H,
        [](JobSpec& s) {
          HeadDim128(s);
          Fp8(s).add_fp8_attention("sequence");
          Fp8(s).set_attention_backward(v1::PrecisionRecipe::ATTENTION_BACKWARD_FP8);
        }}},
      {"model.precision.scale_granularity",
       {R,
        [](JobSpec& s) {
          GpuJob(s);
          Fp8(s).add_fp8_modules("dcn");
          Fp8(s).set_scale_granularity(v1::PrecisionRecipe::MX_32X32);
        }}},
      {"model.heads.loss_weight",
       {R, [](JobSpec& s) { M(s).mutable_heads(0)->set_loss_weight(0.5); }, "spec.model.heads[0].loss_weight"}},
      {"data.dataset", {H, [](JobSpec& s) { D(s).set_dataset("data/other"); }}},
      {"data.eval_dataset", {H, [](JobSpec& s) { D(s).set_eval_dataset("data/eval"); }}},
      {"data.local_batch_size", {H, [](JobSpec& s) { D(s).set_local_batch_size(128); }}},
      {"data.eval_batch_size", {H, [](JobSpec& s) { D(s).set_eval_batch_size(512); }}},
      {"data.micro_batches", {R, [](JobSpec& s) { D(s).set_micro_batches(2); }, "spec.data.micro_batches"}},
      {"data.bbs.enabled", {H, [](JobSpec& s) { D(s).mutable_bbs()->set_enabled(false); }}},
      {"data.bbs.base_batch_size", {H, [](JobSpec& s) { D(s).mutable_bbs()->set_base_batch_size(64); }}},
      {"data.bbs.window", {R, [](JobSpec& s) { D(s).mutable_bbs()->set_window(1); }, "spec.data.bbs.window"}},
      {"data.bbs.cost_weights.per_sample",
       {H, [](JobSpec& s) { D(s).mutable_bbs()->mutable_cost_weights()->set_per_sample(3); }}},
      {"data.bbs.cost_weights.linear", {H, [](JobSpec& s) { D(s).mutable_bbs()->mutable_cost_weights()->set_linear(2); }}},
      {"data.bbs.cost_weights.quadratic",
       {H, [](JobSpec& s) { D(s).mutable_bbs()->mutable_cost_weights()->set_quadratic(0.01); }}},
      {"data.bbs.cost_weights.window",
       {H, [](JobSpec& s) { D(s).mutable_bbs()->mutable_cost_weights()->set_window(0.5); }}},
      {"data.bbs.cost_weights.block", {H, [](JobSpec& s) { D(s).mutable_bbs()->mutable_cost_weights()->set_block(0.5); }}},
      {"resources.workers", {H, [](JobSpec& s) { s.mutable_resources()->set_workers(4); }}},
      {"model.activation_memory.recompute",
       {H, [](JobSpec& s) { M(s).mutable_activation_memory()->add_recompute("sequence"); }}},
      {"model.activation_memory.budget_bytes",
       {H, [](JobSpec& s) { M(s).mutable_activation_memory()->set_budget_bytes(int64_t{1} << 30); }}},
      {"model.activation_memory.fp8_saved",
       {H, [](JobSpec& s) {
          M(s).mutable_activation_memory()->add_recompute("sequence.projections");
          M(s).mutable_activation_memory()->set_fp8_saved(true);
        }}},
      {"resources.gpus_per_worker",
       {R, [](JobSpec& s) { s.mutable_resources()->set_gpus_per_worker(2); }, "spec.resources.gpus_per_worker"}},
      {"parallelism.fsdp_group_size", {H, [](JobSpec& s) { s.mutable_parallelism()->set_fsdp_group_size(2); }}},
      {"parallelism.replicas", {H, [](JobSpec& s) { s.mutable_parallelism()->set_replicas(2); }}},
      {"parallelism.table_sharding_group_size",
       {H, [](JobSpec& s) { s.mutable_parallelism()->set_table_sharding_group_size(2); }}},
      {"parallelism.expert_parallel",
       {R, [](JobSpec& s) { s.mutable_parallelism()->set_expert_parallel(true); }, "spec.parallelism.expert_parallel"}},
      {"training.steps", {H, [](JobSpec& s) { T(s).set_steps(50); }}},
      {"training.eval_every", {H, [](JobSpec& s) { T(s).set_eval_every(10); }}},
      {"training.checkpoint_every", {H, [](JobSpec& s) { T(s).set_checkpoint_every(10); }}},
      {"training.checkpoint_dir", {H, [](JobSpec& s) { T(s).set_checkpoint_dir("ckpt"); }}},
      {"training.dense_learning_rate", {H, [](JobSpec& s) { T(s).set_dense_learning_rate(0.01); }}},
      {"training.sparse_learning_rate", {H, [](JobSpec& s) { T(s).set_sparse_learning_rate(0.1); }}},
      {"training.seed", {H, [](JobSpec& s) { T(s).set_seed(9); }}},
      {"training.max_restarts", {H, [](JobSpec& s) { T(s).set_max_restarts(5); }}},
      {"training.dense_grad_clip_norm", {H, [](JobSpec& s) { T(s).set_dense_grad_clip_norm(1.0); }}},
  };
  return *fields;
}

// Every leaf field path of `d`, prefixed.
void LeafPaths(const google::protobuf::Descriptor* d, const std::string& prefix, std::set<std::string>* out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    const std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    if (f->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE && !f->is_map() &&
        f->message_type()->full_name().rfind("recfleet.", 0) == 0) {
      LeafPaths(f->message_type(), path, out);
    } else {
      out->insert(path);
    }
  }
}

TEST(SpecFieldsTest, EveryFieldHasADecision) {
  std::set<std::string> leaves;
  LeafPaths(JobSpec::descriptor(), "", &leaves);
  for (const std::string& path : leaves) {
    EXPECT_TRUE(Fields().count(path) > 0)
        << "spec." << path << " has no decision: honor it (and add a change it shows in) or reject it at CreateJob";
  }
  for (const auto& [path, field] : Fields()) EXPECT_TRUE(leaves.count(path) > 0) << path << " is not a JobSpec field";
}

// fp8_attention's honored change above also widens the model; here it is
// the only change.
TEST(SpecFieldsTest, Fp8AttentionAloneChangesWhatIsBuilt) {
  JobSpec spec = Base();
  HeadDim128(spec);
  ASSERT_TRUE(Check(spec).ok()) << Check(spec);
  const std::string without = Built(spec);
  Fp8(spec).add_fp8_attention("pma");
  ASSERT_TRUE(Check(spec).ok()) << Check(spec);
  EXPECT_NE(Built(spec), without);
}

TEST(SpecFieldsTest, BaseSpecIsAccepted) { ASSERT_TRUE(Check(Base()).ok()) << Check(Base()); }

TEST(SpecFieldsTest, HonoredFieldsChangeWhatIsBuilt) {
  const std::string base = Built(Base());
  for (const auto& [path, field] : Fields()) {
    if (field.decision != Decision::kHonored) continue;
    JobSpec spec = Base();
    field.change(spec);
    const absl::Status s = Check(spec);
    EXPECT_TRUE(s.ok()) << "spec." << path << ": " << s;
    EXPECT_NE(Built(spec), base) << "spec." << path << " changed nothing that is built";
  }
}

TEST(SpecFieldsTest, RejectedFieldsAreRejectedByPath) {
  for (const auto& [path, field] : Fields()) {
    if (field.decision != Decision::kRejected) continue;
    JobSpec spec = Base();
    field.change(spec);
    const absl::Status s = Check(spec);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "spec." << path;
    const std::string want = field.error_path.empty() ? "spec." + path : field.error_path;
    EXPECT_NE(s.message().find(want), std::string::npos) << "spec." << path << ": " << s.message();
  }
}

// model.activation_memory.recompute takes four names, each honored: the
// engine builds the level ("sequence" and "sequence.attention" are both
// whole blocks) and a one-GPU plan keeps fewer activation bytes at each
// deeper level. fp8_saved (honored above as a flag) keeps fewer still when
// blocks recompute, and alone (nothing recomputes) is refused, naming it.
TEST(SpecFieldsTest, EveryRecomputeLevelAndFp8SavedChangeThePlannedActivations) {
  JobSpec base = Base();
  GpuJob(base);
  // Recomputing the last block saves nothing at the peak (its backward
  // comes first), so the levels show with more than one.
  M(base).mutable_sequence()->set_num_layers(3);
  auto activations = [](const JobSpec& spec) -> double {
    absl::StatusOr<v1::Plan> plan = PlanOneGpu(spec, DefaultHardware());
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? plan->peak_memory().activation_bytes() : -1;
  };
  JobSpec base_fp8 = base;
  M(base_fp8).mutable_activation_memory()->set_fp8_saved(true);
  const absl::Status alone = Check(base_fp8);
  EXPECT_FALSE(alone.ok());
  EXPECT_NE(alone.message().find("fp8_saved"), std::string::npos) << alone;

  std::map<std::string, std::string> built;
  double previous = activations(base);
  for (const char* level : {"sequence.norm", "sequence.projections", "sequence.attention", "sequence"}) {
    JobSpec spec = base;
    M(spec).mutable_activation_memory()->add_recompute(level);
    ASSERT_TRUE(Check(spec).ok()) << level << ": " << Check(spec);
    built[level] = Built(spec);
    const double kept = activations(spec);
    if (std::string(level) == "sequence") {
      EXPECT_DOUBLE_EQ(kept, previous) << "'sequence' is 'sequence.attention'";
    } else {
      EXPECT_LT(kept, previous) << level;
    }
    previous = kept;
    JobSpec fp8 = spec;
    M(fp8).mutable_activation_memory()->set_fp8_saved(true);
    ASSERT_TRUE(Check(fp8).ok()) << level << ": " << Check(fp8);
    EXPECT_LT(activations(fp8), kept) << level << " with fp8_saved";
  }
  EXPECT_NE(built["sequence.norm"], built["sequence.projections"]);
  EXPECT_NE(built["sequence.projections"], built["sequence.attention"]);
  EXPECT_EQ(built["sequence.attention"], built["sequence"]);
}

}  // namespace
}  // namespace recfleet::coordinator
