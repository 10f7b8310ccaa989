#include "services/coordinator/plan_adapter.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "data/dataset_file.h"
#include "engine/job_model.h"
#include "engine/step_cost.h"
#include "engine/step_rates.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "services/coordinator/test_specs.h"

namespace recfleet::coordinator {
namespace {

const planner::DenseModule* FindModule(const planner::PlanRequest& r, const std::string& name) {
  for (const planner::DenseModule& m : r.model.modules) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

// ValidSpec: numeric 13, user_id -> users (dim 16), history -> items
// (max_length 512), ad_item -> items (dim 32); sequence 2 layers of D = 64,
// BLOCK attention; 1 cross layer + 4 PMA queries; DCN 2 layers rank 16; MoE
// 4 experts top-2 of [128]; CTR and CVR heads [64].
TEST(PlanAdapterTest, EstimatesFollowTheDocumentedFormulas) {
  auto request = PlanRequestFromSpec(ValidSpec(2));
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->local_batch, 256);
  ASSERT_EQ(request->model.sequence_lengths.size(), 1u);
  EXPECT_DOUBLE_EQ(request->model.sequence_lengths[0].length, 512);

  ASSERT_EQ(request->model.tables.size(), 2u);
  const planner::Table& items = request->model.tables[0];
  EXPECT_EQ(items.rows, 100000);
  EXPECT_EQ(items.dim, 32);
  EXPECT_FALSE(items.pooled);                   // Used by a SEQUENCE feature.
  EXPECT_DOUBLE_EQ(items.pooling_factor, 513);  // 512 history ids + 1 candidate.
  EXPECT_TRUE(request->model.tables[1].pooled);
  EXPECT_DOUBLE_EQ(request->model.tables[1].pooling_factor, 1);

  const double d = 64;
  const planner::DenseModule* proj = FindModule(*request, "sequence.proj");
  ASSERT_NE(proj, nullptr);
  EXPECT_EQ(proj->params, static_cast<int64_t>(2 * 12 * d * d));
  // 24 d^2 per token per layer, of which q, k, v's 6 d^2 are the
  // projections level's (what recomputing that level redoes).
  EXPECT_DOUBLE_EQ(proj->flops_per_token, 2 * 18 * d * d);
  EXPECT_FALSE(proj->recomputable);
  const planner::DenseModule* qkv = FindModule(*request, "sequence.projections");
  ASSERT_NE(qkv, nullptr);
  EXPECT_DOUBLE_EQ(qkv->flops_per_token, 2 * 6 * d * d);
  EXPECT_TRUE(qkv->recomputable);
  EXPECT_EQ(qkv->recompute_units, 2);
  // Per block and token: q, k, v in bf16.
  EXPECT_DOUBLE_EQ(qkv->activation_bytes_per_sample, 2 * 3 * d * 2 * 512);
  const planner::DenseModule* norm = FindModule(*request, "sequence.norm");
  ASSERT_NE(norm, nullptr);
  EXPECT_DOUBLE_EQ(norm->activation_bytes_per_sample, 2 * d * 2 * 512);
  const planner::DenseModule* attn = FindModule(*request, "sequence.attention");
  ASSERT_NE(attn, nullptr);
  EXPECT_EQ(attn->op, planner::OpKind::kAttention);
  EXPECT_DOUBLE_EQ(attn->flops_per_token, 2 * 4 * d * 64);  // BLOCK of 64.
  EXPECT_DOUBLE_EQ(attn->flops_per_token_sq, 0);
  EXPECT_EQ(attn->RegionName(), "sequence.attention");

  const planner::DenseModule* cross = FindModule(*request, "cross");
  ASSERT_NE(cross, nullptr);
  EXPECT_EQ(cross->params, static_cast<int64_t>(2 * 4 * d * d));  // Cross layer + PMA.
  EXPECT_DOUBLE_EQ(cross->flops_per_sample, 4 * d * d * (1 + 4));  // 1 candidate + 4 queries.

  // d0 = 13 + 16 + 32 + 64 x 4 (PMA) + 64 x 1 (cross, one candidate) = 381.
  const double w = 381;
  const planner::DenseModule* dcn = FindModule(*request, "dcn0");
  ASSERT_NE(dcn, nullptr);
  EXPECT_EQ(dcn->params, static_cast<int64_t>(2 * (2 * w * 16 + w)));
  EXPECT_DOUBLE_EQ(dcn->flops_per_sample, 2 * 4 * w * 16);
  const planner::DenseModule* moe = FindModule(*request, "moe1");
  ASSERT_NE(moe, nullptr);
  EXPECT_EQ(moe->num_experts, 4);
  EXPECT_EQ(moe->params, static_cast<int64_t>(4 * (w * 128 + 128) + w * 4));
  EXPECT_DOUBLE_EQ(moe->flops_per_sample, 2 * (2 * w * 128));  // top-2 experts.
  const planner::DenseModule* ctr = FindModule(*request, "head.ctr");
  ASSERT_NE(ctr, nullptr);
  EXPECT_EQ(ctr->params, 128 * 64 + 64 + 64 * 1 + 1);  // From the MoE's 128 outputs.
  EXPECT_NE(FindModule(*request, "head.cvr"), nullptr);
}

TEST(PlanAdapterTest, NamedModulesAndFullAttention) {
  auto spec = ValidSpec(2);
  spec.mutable_model()->mutable_dense(0)->set_name("crossnet");
  spec.mutable_model()->mutable_sequence()->mutable_attention()->set_kind(
      ::recfleet::v1::AttentionSpec::FULL);
  auto request = PlanRequestFromSpec(spec);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_NE(FindModule(*request, "crossnet"), nullptr);
  EXPECT_DOUBLE_EQ(FindModule(*request, "sequence.attention")->flops_per_token_sq, 2 * 4 * 64);
}

TEST(PlanAdapterTest, UnknownTableNamesTheFeature) {
  auto spec = ValidSpec(2);
  spec.mutable_model()->mutable_features(1)->set_table("nope");
  auto request = PlanRequestFromSpec(spec);
  ASSERT_FALSE(request.ok());
  EXPECT_EQ(request.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(request.status().message().find("spec.model.features[1].table"), std::string::npos);
}

WorkerView Worker(const std::string& id, const std::string& node, const std::string& domain,
                  const std::string& zone) {
  WorkerView w;
  w.id = id;
  w.gpus = 8;
  w.topology.set_node(node);
  w.topology.set_nvlink_domain(domain);
  w.topology.set_zone(zone);
  return w;
}

// One worker of one GPU.
Placement OneGpu() {
  Placement one;
  one.ranks_per_worker = 1;
  one.workers = {Worker("a", "n1", "n1", "z1")};
  one.workers[0].gpus = 1;
  return one;
}

TEST(PlanAdapterTest, TopologyFromLabels) {
  Placement p;
  p.ranks_per_worker = 8;
  p.workers = {Worker("a", "n1", "d1", "z1"), Worker("b", "n2", "d1", "z1"),
               Worker("c", "n3", "d2", "z2"), Worker("d", "n4", "d2", "z2")};
  auto t = TopologyFromPlacement(p, DefaultHardware());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->num_nodes, 4);
  EXPECT_EQ(t->gpus_per_node, 8);
  EXPECT_EQ(t->nodes_per_nvlink_domain, 2);
  EXPECT_EQ(t->nodes_per_zone, 2);
  EXPECT_EQ(t->WorldSize(), 32);
  EXPECT_DOUBLE_EQ(t->hbm_bytes_per_gpu, 141e9);
}

TEST(PlanAdapterTest, UnevenLabelsFlattenTheFleet) {
  Placement p;
  p.ranks_per_worker = 8;
  // Zone z1 holds two nodes, z2 one: not a uniform nesting.
  p.workers = {Worker("a", "n1", "d1", "z1"), Worker("b", "n2", "d2", "z1"),
               Worker("c", "n3", "d3", "z2")};
  auto t = TopologyFromPlacement(p, DefaultHardware());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->num_nodes, 3);
  EXPECT_EQ(t->nodes_per_zone, 3);
  EXPECT_EQ(t->nodes_per_nvlink_domain, 1);
}

// The plan's peak memory is a GPU's: a CPU job's peak is predicted only from
// a CPU table that measured memory, over the worker's reported resident
// memory (the largest of the placement's), while a GPU job's is the plan's.
TEST(PlanAdapterTest, PeakMemoryPredictedForGpuJobsAndMeasuredMemoryTables) {
  Placement p;
  p.ranks_per_worker = 1;
  p.workers = {Worker("a", "n1", "n1", "z1"), Worker("b", "n2", "n2", "z1")};
  p.workers[0].resident_memory_bytes = 100 << 20;
  p.workers[1].resident_memory_bytes = 120 << 20;
  engine::StepRates cpu;
  cpu.device = "cpu";
  cpu.gemm_flops_per_s = 1e9;
  cpu.attention_flops_per_s = 1e9;
  auto spec = BuildableSpec(2);
  spec.mutable_resources()->set_gpus_per_worker(0);
  absl::StatusOr<GroupPlan> without = PlanningGroupPlanner(DefaultHardware(), {cpu})(spec, p);
  ASSERT_TRUE(without.ok()) << without.status();
  ASSERT_TRUE(without->plan.has_value());
  EXPECT_EQ(without->predicted_peak_bytes, 0);
  EXPECT_FALSE(CpuRankPeakBytes(spec, cpu, 1).ok());
  // The summary does not quote the plan's GPU memory for a CPU job.
  EXPECT_NE(without->summary.find("peak per CPU rank not predicted"), std::string::npos) << without->summary;
  EXPECT_EQ(without->summary.find("GPU"), std::string::npos) << without->summary;
  EXPECT_EQ(without->plan->summary(), without->summary);

  cpu.fixed_bytes = 8 << 20;
  cpu.bytes_per_token_element = 40;
  absl::StatusOr<GroupPlan> with = PlanningGroupPlanner(DefaultHardware(), {cpu})(spec, p);
  ASSERT_TRUE(with.ok()) << with.status();
  absl::StatusOr<double> expected = CpuRankPeakBytes(spec, cpu, 120 << 20);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_EQ(with->predicted_peak_bytes, *expected);
  EXPECT_NE(with->summary.find(absl::StrFormat("peak %.1f MiB resident per CPU rank", *expected / (1 << 20))),
            std::string::npos)
      << with->summary;
  EXPECT_EQ(with->plan->summary(), with->summary);
  // The job's own bytes: the model's static state, activations, fixed.
  absl::StatusOr<engine::JobModel> model = engine::BuildJobModel(spec);
  ASSERT_TRUE(model.ok());
  const engine::StepCounts n = engine::CountStep(*model, SpecSequenceLengths(spec, *model));
  const double job = *expected - (120 << 20);
  EXPECT_GT(job, engine::StaticBytes(n) + cpu.fixed_bytes);
  // Activations scale with the local batch, the rest does not.
  spec.mutable_data()->set_local_batch_size(2 * spec.data().local_batch_size());
  absl::StatusOr<double> doubled = CpuRankPeakBytes(spec, cpu, 120 << 20);
  ASSERT_TRUE(doubled.ok());
  EXPECT_NEAR(*doubled - *expected, job - engine::StaticBytes(n) - cpu.fixed_bytes, 1);

  // A worker that reported no resident memory gets no CPU prediction.
  p.workers[0].resident_memory_bytes = p.workers[1].resident_memory_bytes = 0;
  absl::StatusOr<GroupPlan> unreported = PlanningGroupPlanner(DefaultHardware(), {cpu})(spec, p);
  ASSERT_TRUE(unreported.ok());
  EXPECT_EQ(unreported->predicted_peak_bytes, 0);

  spec.mutable_resources()->set_gpus_per_worker(1);
  const Placement one = OneGpu();
  spec.mutable_resources()->set_workers(1);
  absl::StatusOr<GroupPlan> gpu = PlanningGroupPlanner(DefaultHardware(), {})(spec, one);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(gpu->predicted_peak_bytes, gpu->plan->peak_memory().total_bytes());
  EXPECT_NE(gpu->summary.find("GiB per GPU"), std::string::npos) << gpu->summary;
}

// A dataset directory is priced at the lengths in its file, not at the
// cap; one that cannot be read, at the cap.
TEST(PlanAdapterTest, DatasetDirectoryLengthsAreSampledFromItsFile) {
  const std::string dir = std::string(testing::TempDir()) + "/lengths_dataset";
  std::filesystem::create_directories(dir);
  data::Schema schema;
  schema.features = {{"history", data::DType::kInt64, data::Layout::kJagged, "items"}};
  data::Batch rows(std::make_shared<const data::Schema>(schema));
  for (int r = 0; r < 4100; ++r) {
    std::vector<int64_t> h(r % 41, 1);  // 0..40, mean 20.
    rows.AddJaggedInt64(0, h.data(), h.size());
    ASSERT_TRUE(rows.CommitRow().ok());
  }
  data::WriterOptions o;
  o.max_rows_per_block = 100;
  auto w = data::DatasetWriter::Create(dir + "/train.rfd", rows.schema(), o);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Write(rows).ok());
  ASSERT_TRUE((*w)->Close().ok());

  auto spec = BuildableSpec(1);  // history: max_length 512.
  spec.mutable_data()->set_dataset(dir);
  absl::StatusOr<engine::JobModel> model = engine::BuildJobModel(spec);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int64_t> lengths = SpecSequenceLengths(spec, *model);
  ASSERT_FALSE(lengths.empty());
  double mean = 0;
  for (int64_t l : lengths) mean += static_cast<double>(l) / static_cast<double>(lengths.size());
  EXPECT_NEAR(mean, 20, 1);
  EXPECT_LE(*std::max_element(lengths.begin(), lengths.end()), 40);

  spec.mutable_data()->set_dataset(dir + "/absent");
  for (int64_t l : SpecSequenceLengths(spec, *model)) ASSERT_EQ(l, 512);

  // A relative path resolves under the data root, as on the loaders.
  spec.mutable_data()->set_dataset("lengths_dataset");
  spec.mutable_data()->set_eval_dataset("synthetic://e?samples=10");
  const ::recfleet::v1::JobSpec planned = SpecForPlanning(spec, testing::TempDir());
  EXPECT_EQ(planned.data().dataset(), std::string(testing::TempDir()) + "/lengths_dataset");
  EXPECT_EQ(planned.data().eval_dataset(), "synthetic://e?samples=10");
  EXPECT_EQ(SpecSequenceLengths(planned, *model), lengths);
  EXPECT_EQ(SpecForPlanning(spec, "").data().dataset(), "lengths_dataset");
  spec.mutable_data()->set_dataset("file://lengths_dataset");  // As the loaders read it.
  EXPECT_EQ(SpecForPlanning(spec, testing::TempDir()).data().dataset(), planned.data().dataset());
  spec.mutable_data()->set_dataset(dir);
  EXPECT_EQ(SpecForPlanning(spec, "/elsewhere").data().dataset(), dir);  // Absolute: kept.
}

TEST(PlanAdapterTest, GroupsFollowThePlan) {
  Placement p;
  p.ranks_per_worker = 8;
  p.workers = {Worker("a", "n1", "n1", "z1"), Worker("b", "n2", "n2", "z1")};
  auto spec = ValidSpec(2);
  spec.mutable_resources()->set_gpus_per_worker(8);
  auto plan = PlanPlacement(spec, p, DefaultHardware());
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->world, 16);
  auto groups = PlanGroups(*plan);
  ASSERT_FALSE(groups.empty());
  EXPECT_EQ(groups[0].name(), "world");
  EXPECT_EQ(groups[0].ranks_size(), 16);
  // Every rank is in exactly one fsdp group of fsdp_group consecutive ranks,
  // and in exactly one tables group.
  for (const std::string prefix : {"fsdp/", "tables/"}) {
    std::multiset<int> seen;
    for (const auto& g : groups) {
      if (g.name().rfind(prefix, 0) != 0) continue;
      if (prefix == std::string("fsdp/")) {
        ASSERT_EQ(g.ranks_size(), plan->dense.fsdp_group);
        for (int i = 1; i < g.ranks_size(); ++i) EXPECT_EQ(g.ranks(i), g.ranks(i - 1) + 1);
      } else {
        ASSERT_EQ(g.ranks_size(), plan->sparse.mp_group);
      }
      seen.insert(g.ranks().begin(), g.ranks().end());
    }
    ASSERT_EQ(seen.size(), 16u) << prefix;
    for (int r = 0; r < 16; ++r) EXPECT_EQ(seen.count(r), 1u) << prefix << r;
  }
  const std::string summary = PlanSummary(*plan);
  EXPECT_NE(summary.find("FSDP"), std::string::npos);
  auto proto = PlanToProto(*plan);
  EXPECT_EQ(proto.world_size(), 16);
  EXPECT_EQ(proto.sparse().tables_size(), 2);
  EXPECT_EQ(proto.step().exposed_seconds_size(), 3);
  EXPECT_FALSE(proto.decisions().empty());
  EXPECT_EQ(proto.summary(), summary);
}

// The scheduler plans every job, so small CPU gangs of any size must plan.
TEST(PlanAdapterTest, SmallCpuGangsOfAnySizePlan) {
  for (int workers : {1, 2, 3, 5, 6}) {
    Placement p;
    p.ranks_per_worker = 1;
    for (int i = 0; i < workers; ++i) {
      p.workers.push_back(Worker(std::to_string(i), "", "", ""));
    }
    auto plan = PlanPlacement(ValidSpec(workers), p, DefaultHardware());
    ASSERT_TRUE(plan.ok()) << workers << ": " << plan.status();
    EXPECT_EQ(plan->world, workers);
    std::set<int> fsdp_ranks;
    for (const auto& g : PlanGroups(*plan)) {
      if (g.name().rfind("fsdp/", 0) == 0) fsdp_ranks.insert(g.ranks().begin(), g.ranks().end());
    }
    EXPECT_EQ(fsdp_ranks.size(), static_cast<size_t>(workers));
  }
}

// The job's precision recipe reaches the planner: its FP8 modules are
// estimated at the rate measured for them, quantization included (0.92x
// bf16's at the engine's batch sizes: a longer step), and the plan states
// the recipe and that rate.
TEST(PlanAdapterTest, PrecisionRecipeIsPlannedAndShown) {
  Placement p;
  p.ranks_per_worker = 8;
  p.workers = {Worker("a", "n1", "n1", "z1")};
  auto spec = ValidSpec(1);
  spec.mutable_resources()->set_gpus_per_worker(8);
  auto bf16 = PlanPlacement(spec, p, DefaultHardware());
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  auto* recipe = spec.mutable_model()->mutable_precision();
  recipe->add_fp8_modules("moe.experts.l1");
  recipe->add_fp8_modules("towers");
  auto request = PlanRequestFromSpec(spec);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->precision.fp8_modules,
            (std::set<std::string>{"moe1", "head.ctr", "head.cvr"}));
  auto fp8 = PlanPlacement(spec, p, DefaultHardware());
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ(request->precision.fp8_speedup, 0.92);
  EXPECT_GT(fp8->step.dense_compute_s, bf16->step.dense_compute_s);
  std::string shown, why;
  const ::recfleet::v1::Plan fp8_proto = PlanToProto(*fp8), bf16_proto = PlanToProto(*bf16);
  for (const auto& d : fp8_proto.decisions()) {
    if (d.dimension() == "precision") shown = d.chosen(), why = d.reason();
  }
  EXPECT_NE(why.find("estimated at 0.92x the bf16 rate"), std::string::npos) << why;
  EXPECT_NE(shown.find("FP8 (E4M3, 1x128 activation / 128x128 weight scales) in moe.experts.l1, towers; "
                       "weight gradients bf16"),
            std::string::npos)
      << shown;
  for (const auto& d : bf16_proto.decisions()) EXPECT_NE(d.dimension(), "precision");

  // The FP8 all-gather and the quality gate are shown with the recipe; on a
  // CPU job (FP8 all-gather only) the GEMMs stay at the CPU's rate.
  recipe->set_all_gather(v1::PrecisionRecipe::ALL_GATHER_FP8);
  recipe->mutable_quality_gate()->set_max_relative_ne_increase(0.001);
  request = PlanRequestFromSpec(spec);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_NE(request->precision.recipe.find("; FSDP all-gather of their weights in FP8"), std::string::npos)
      << request->precision.recipe;
  EXPECT_NE(request->precision.recipe.find("; quality gate: eval NE within +0.1% of bf16 on a 200-step shadow run"),
            std::string::npos)
      << request->precision.recipe;
  // The all-gather's bytes follow the field: the workers gather fp32, the
  // FP8 modules' weights FP8 under ALL_GATHER_FP8.
  EXPECT_TRUE(request->precision.fp8_all_gather);
  EXPECT_EQ(request->precision.weight_gather_bytes, 4);
  Placement two = p;
  two.workers.push_back(Worker("b", "n2", "n2", "z1"));
  spec.mutable_resources()->set_workers(2);
  recipe->clear_quality_gate();
  auto gather_bytes = [&](const planner::Plan& plan, const std::string& module) {
    double bytes = 0;
    for (const planner::CommOp& op : plan.comm) {
      if (op.name == "FSDP all-gather (forward) " + module) bytes += op.bytes;
    }
    return bytes;
  };
  auto fp8_gather = PlanPlacement(spec, two, DefaultHardware());
  ASSERT_TRUE(fp8_gather.ok()) << fp8_gather.status();
  recipe->set_all_gather(v1::PrecisionRecipe::ALL_GATHER_FULL);
  auto full_gather = PlanPlacement(spec, two, DefaultHardware());
  ASSERT_TRUE(full_gather.ok()) << full_gather.status();
  const double fp8_bytes = gather_bytes(*fp8_gather, "head.ctr"), full_bytes = gather_bytes(*full_gather, "head.ctr");
  EXPECT_GT(full_bytes, 0);
  EXPECT_DOUBLE_EQ(fp8_bytes * 4, full_bytes);
  recipe->set_all_gather(v1::PrecisionRecipe::ALL_GATHER_FP8);
  spec.mutable_resources()->set_workers(1);
  spec.mutable_resources()->set_gpus_per_worker(0);
  request = PlanRequestFromSpec(spec);
  ASSERT_TRUE(request.ok()) << request.status();
  // A CPU job: no FP8 GEMM, but its all-gather still carries those weights
  // as FP8.
  EXPECT_TRUE(request->precision.fp8_modules.empty());
  EXPECT_EQ(request->precision.fp8_gather_modules, (std::set<std::string>{"moe1", "head.ctr", "head.cvr"}));
  EXPECT_EQ(request->precision.GatherBytes("head.ctr"), 1);
  EXPECT_EQ(request->precision.GatherBytes("moe0"), 4);
  EXPECT_NE(request->precision.recipe.find("fp32 GEMMs on CPU workers; weights of moe.experts.l1, towers rounded to "
                                           "FP8 by the all-gather"),
            std::string::npos)
      << request->precision.recipe;
}

// FP8 attention is shown with the recipe (alone, or after the FP8 modules);
// the planner keeps the attention at bf16's time (its FP8 forward with the
// quantize pre-pass is not faster).
TEST(PlanAdapterTest, Fp8AttentionIsShownWithTheRecipe) {
  auto spec = ValidSpec(1);
  spec.mutable_resources()->set_gpus_per_worker(1);
  auto* recipe = spec.mutable_model()->mutable_precision();
  recipe->add_fp8_attention("sequence");
  recipe->add_fp8_attention("pma");
  recipe->mutable_quality_gate()->set_max_relative_ne_increase(0.01);
  auto request = PlanRequestFromSpec(spec);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_TRUE(request->precision.fp8_modules.empty());
  EXPECT_EQ(request->precision.recipe,
            "FP8 (E4M3) attention forward in sequence, pma, its backward bf16; quality gate: eval NE within +1% "
            "of bf16 on a 200-step shadow run");
  recipe->add_fp8_modules("towers");
  request = PlanRequestFromSpec(spec);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_NE(
      request->precision.recipe.find("every other linear layer bf16; FP8 (E4M3) attention forward in sequence, pma"),
      std::string::npos)
      << request->precision.recipe;
  recipe->set_attention_backward(v1::PrecisionRecipe::ATTENTION_BACKWARD_FP8);
  request = PlanRequestFromSpec(spec);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_NE(request->precision.recipe.find("FP8 (E4M3) attention forward and backward in sequence, pma, the "
                                           "backward's e4m3 copies in the peak's buffers; quality gate"),
            std::string::npos)
      << request->precision.recipe;
}

// With attention_backward FP8, each FP8 block's module carries one call's
// temporaries as Fp8Backward (kernels/attention/attention_cuda.cc)
// allocates them, and the peak exceeds the bf16 backward's by the largest.
// D = 256 (2 heads of 128), 256 samples of 512 history tokens: the
// self-attention call over T = 131,072 rows holds 7 T D bytes of e4m3 (q,
// dO, k, v and q, dO, k transposed), 3 T x 2 heads fp32 (q and dO scales,
// rowsums) and 8 D fp32 (channel scales, amax); PMA's, over 1,024 queries
// (4 per sample) and the T keys, is the larger of the "cross" module's two.
// The FP8 forward alone plans as bf16.
TEST(PlanAdapterTest, Fp8AttentionBackwardTemporariesRaiseThePeak) {
  auto spec = ValidSpec(1);
  spec.mutable_resources()->set_gpus_per_worker(1);
  v1::SequenceBranch* seq = spec.mutable_model()->mutable_sequence();
  seq->set_model_dim(256);
  seq->set_num_heads(2);
  seq->mutable_attention()->set_kind(v1::AttentionSpec::FULL);
  seq->mutable_attention()->set_activation(v1::AttentionSpec::SOFTMAX);
  spec.mutable_model()->mutable_cross()->set_num_heads(2);
  const Placement one = OneGpu();
  auto bf16 = PlanPlacement(spec, one, DefaultHardware());
  ASSERT_TRUE(bf16.ok()) << bf16.status();

  auto* recipe = spec.mutable_model()->mutable_precision();
  for (const char* block : {"sequence", "cross", "pma"}) recipe->add_fp8_attention(block);
  auto request = PlanRequestFromSpec(spec);
  ASSERT_TRUE(request.ok()) << request.status();
  for (const planner::DenseModule& m : request->model.modules) EXPECT_EQ(m.backward_scratch_bytes_per_sample, 0);
  auto forward = PlanPlacement(spec, one, DefaultHardware());
  ASSERT_TRUE(forward.ok()) << forward.status();
  EXPECT_EQ(forward->peak.Total(), bf16->peak.Total());

  recipe->set_attention_backward(v1::PrecisionRecipe::ATTENTION_BACKWARD_FP8);
  request = PlanRequestFromSpec(spec);
  ASSERT_TRUE(request.ok()) << request.status();
  const double t = 256 * 512, d = 256, self_call = 7 * t * d + 4 * (3 * t * 2 + 8 * d);
  const double pma_call = d * (2 * 1024 + 2 * t + 2 * 1024 + t) + 4 * (3 * 1024 * 2 + 8 * d);
  EXPECT_DOUBLE_EQ(self_call, 238034944);
  const planner::DenseModule* attention = FindModule(*request, "sequence.attention");
  const planner::DenseModule* cross = FindModule(*request, "cross");
  ASSERT_NE(attention, nullptr);
  ASSERT_NE(cross, nullptr);
  EXPECT_DOUBLE_EQ(attention->backward_scratch_bytes_per_sample * 256, self_call);
  EXPECT_DOUBLE_EQ(cross->backward_scratch_bytes_per_sample * 256, pma_call);
  auto backward = PlanPlacement(spec, one, DefaultHardware());
  ASSERT_TRUE(backward.ok()) << backward.status();
  EXPECT_DOUBLE_EQ(backward->peak.activations, bf16->peak.activations);
  EXPECT_NEAR(backward->peak.Total() - bf16->peak.Total(), self_call, 1e-3);
}

// A quality gate trains a shadow model beside the job's resident one
// before the first step: the plan's peak holds the job's tables, weights
// and optimizer state once more (as buffers), and nothing else changes.
TEST(PlanAdapterTest, QualityGateShadowModelRaisesThePeak) {
  auto spec = ValidSpec(1);
  spec.mutable_resources()->set_gpus_per_worker(1);
  spec.mutable_model()->mutable_precision()->add_fp8_modules("dcn");
  const Placement one = OneGpu();
  auto plain = PlanPlacement(spec, one, DefaultHardware());
  ASSERT_TRUE(plain.ok()) << plain.status();
  spec.mutable_model()->mutable_precision()->mutable_quality_gate()->set_max_relative_ne_increase(0.01);
  auto request = PlanRequestFromSpec(spec);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_TRUE(request->shadow_model);
  auto gated = PlanPlacement(spec, one, DefaultHardware());
  ASSERT_TRUE(gated.ok()) << gated.status();
  const planner::MemoryBreakdown& m = plain->peak;
  EXPECT_GT(m.embedding + m.dense + m.optimizer, 0);
  EXPECT_DOUBLE_EQ(gated->peak.embedding, m.embedding);
  EXPECT_DOUBLE_EQ(gated->peak.activations, m.activations);
  EXPECT_NEAR(gated->peak.buffers - m.buffers, m.embedding + m.dense + m.optimizer, 1e-3);
}

TEST(PlanAdapterTest, ParallelismHintsConstrainThePlan) {
  Placement p;
  p.ranks_per_worker = 8;
  p.workers = {Worker("a", "n1", "n1", "z1"), Worker("b", "n2", "n2", "z1")};
  auto spec = ValidSpec(2);
  spec.mutable_resources()->set_gpus_per_worker(8);
  spec.mutable_parallelism()->set_fsdp_group_size(2);
  spec.mutable_parallelism()->set_table_sharding_group_size(4);
  auto plan = PlanPlacement(spec, p, DefaultHardware());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->dense.fsdp_group, 2);
  EXPECT_EQ(plan->dense.replicas, 8);
  EXPECT_EQ(plan->sparse.mp_group, 4);
  int fsdp_groups = 0;
  for (const auto& g : PlanGroups(*plan)) fsdp_groups += g.name().rfind("fsdp/", 0) == 0;
  EXPECT_EQ(fsdp_groups, 8);
  bool explained = false;
  const ::recfleet::v1::Plan proto = PlanToProto(*plan);
  for (const auto& d : proto.decisions()) {
    explained |= d.dimension() == "parallelism hints";
  }
  EXPECT_TRUE(explained);

  // 12 divides no 16-rank fleet: the error names the spec field.
  spec.mutable_parallelism()->set_fsdp_group_size(0);
  spec.mutable_parallelism()->set_table_sharding_group_size(12);
  plan = PlanPlacement(spec, p, DefaultHardware());
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("parallelism.table_sharding_group_size"),
            std::string::npos)
      << plan.status();
}

TEST(PlanAdapterTest, TablesThatCannotFitFailWithThePlannersReason) {
  auto spec = ValidSpec(2);
  // 4e9 rows x 512 fp32 = 8 TB: beyond two 141 GB CPU ranks in any layout.
  spec.mutable_model()->mutable_tables(1)->set_rows(4000000000);
  spec.mutable_model()->mutable_tables(1)->set_dim(512);
  Placement p;
  p.ranks_per_worker = 1;
  p.workers = {Worker("a", "n1", "", ""), Worker("b", "n2", "", "")};
  auto plan = PlanPlacement(spec, p, DefaultHardware());
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(plan.status().message().find("users"), std::string::npos) << plan.status();
}

// model.activation_memory on one GPU. The sequence blocks are three nested
// checkpoint regions (norm, projections, attention), each cut in whole
// blocks; every other region keeps all its activations. Recomputing the
// last of the two blocks' projections or attention saves nothing at the
// peak (its backward comes first and brings its activations back), so the
// planner cuts one block of those levels at most and a level the job forces
// keeps one block's bytes; the last block's norm output, recomputed after
// its attention's backward, is off the peak unless every block recomputes
// its projections. A budget short by half the norm level's bytes cuts the
// norm of one block (the cheapest bytes); one short by half of every level
// cuts the norm of both blocks (free) and the projections and attention of
// one, so the engine recomputes block 0 whole and block 1's norm; a budget
// below what that can save fails; naming "sequence" recomputes every block
// whole.
TEST(PlanAdapterTest, ActivationBudgetChoosesSequenceLevelsForTheEngine) {
  auto spec = BuildableSpec(1);
  spec.mutable_resources()->set_gpus_per_worker(1);
  absl::StatusOr<v1::Plan> free = PlanOneGpu(spec, DefaultHardware());
  ASSERT_TRUE(free.ok()) << free.status();
  using engine::layers::BlockCheckpoint;
  using Modes = std::vector<BlockCheckpoint>;
  double others = 0, level[3] = {0, 0, 0};
  for (const v1::RegionCheckpointPlan& r : free->checkpoint()) {
    EXPECT_EQ(r.kept_bytes(), r.full_bytes()) << r.region();
    EXPECT_EQ(r.recomputed_units(), 0) << r.region();
    bool is_level = false;
    for (int i = 0; i < 3; ++i) {
      if (r.region() != engine::kSequenceCheckpointRegions[i]) continue;
      EXPECT_EQ(r.units(), 2);
      level[i] = r.full_bytes();
      is_level = true;
    }
    if (!is_level) {
      EXPECT_EQ(r.units(), 0) << r.region();
      others += r.full_bytes();
    }
  }
  for (double b : level) ASSERT_GT(b, 0);
  const double total = others + level[0] + level[1] + level[2];
  EXPECT_NEAR(free->peak_memory().activation_bytes(), total, 1e-6 * total);

  spec.mutable_model()->mutable_activation_memory()->add_recompute("sequence");
  absl::StatusOr<v1::Plan> named = PlanOneGpu(spec, DefaultHardware());
  ASSERT_TRUE(named.ok()) << named.status();
  for (const v1::RegionCheckpointPlan& r : named->checkpoint()) {
    for (int i = 0; i < 3; ++i) {
      if (r.region() != engine::kSequenceCheckpointRegions[i]) continue;
      EXPECT_EQ(r.recomputed_units(), 2);
      EXPECT_NEAR(r.kept_bytes(), level[i] / 2, 1e-6 * level[i]);
      // The norm's elementwise pass is priced at 0; the GEMMs and the
      // attention are not.
      if (i > 0) {
        EXPECT_GT(r.recompute_seconds(), 0) << r.region();
      }
    }
  }
  absl::StatusOr<engine::JobModel> model = engine::BuildJobModel(spec);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(*engine::AttentionCheckpointModes(*model, nullptr), Modes(2, BlockCheckpoint::kBlock));

  spec.mutable_model()->clear_activation_memory();
  spec.mutable_model()->mutable_activation_memory()->set_budget_bytes(
      static_cast<int64_t>(total - level[0] / 2 + 16));
  absl::StatusOr<v1::Plan> budget = PlanOneGpu(spec, DefaultHardware());
  ASSERT_TRUE(budget.ok()) << budget.status();
  EXPECT_NEAR(budget->peak_memory().activation_bytes(), total - level[0] / 2, 1e-6 * total);
  model = engine::BuildJobModel(spec);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(*engine::AttentionCheckpointModes(*model, &*budget),
            (Modes{BlockCheckpoint::kNorm, BlockCheckpoint::kNone}));
  bool shown = false;
  for (const v1::PlanDecision& d : budget->decisions()) {
    shown = shown || d.chosen().find("sequence.norm: 1 of 2 blocks recomputed") != std::string::npos;
  }
  EXPECT_TRUE(shown);

  const double one_block = (level[0] + level[1] + level[2]) / 2;
  spec.mutable_model()->mutable_activation_memory()->set_budget_bytes(
      static_cast<int64_t>(total - one_block + 16));
  budget = PlanOneGpu(spec, DefaultHardware());
  ASSERT_TRUE(budget.ok()) << budget.status();
  EXPECT_NEAR(budget->peak_memory().activation_bytes(), total - one_block - level[0] / 2,
              1e-6 * total);
  EXPECT_EQ(*engine::AttentionCheckpointModes(*model, &*budget),
            (Modes{BlockCheckpoint::kBlock, BlockCheckpoint::kNorm}));
  spec.mutable_model()->mutable_activation_memory()->set_budget_bytes(
      static_cast<int64_t>(total - one_block - level[0] / 2 + 16));
  EXPECT_TRUE(PlanOneGpu(spec, DefaultHardware()).ok());
  spec.mutable_model()->mutable_activation_memory()->set_budget_bytes(
      static_cast<int64_t>(total - one_block - level[0] / 2 - 1024));
  EXPECT_FALSE(PlanOneGpu(spec, DefaultHardware()).ok());
}

}  // namespace
}  // namespace recfleet::coordinator
