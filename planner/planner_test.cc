#include "planner/planner.h"

#include <random>
#include <string>

#include "gtest/gtest.h"
#include "planner/report.h"

namespace recfleet::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

Topology MakeTopology(int nodes, int gpus, int nodes_per_zone, double hbm_gib) {
  Topology t;
  t.name = "test";
  t.num_nodes = nodes;
  t.gpus_per_node = gpus;
  t.nodes_per_zone = nodes_per_zone;
  t.hbm_bytes_per_gpu = hbm_gib * kGiB;
  t.peak_flops_per_gpu = 1e15;
  t.hbm_bandwidth_bytes_per_s = 3e12;
  t.links[kNvlink] = {100e9, 5e-6};
  t.links[kZone] = {50e9, 10e-6};
  t.links[kCrossZone] = {10e9, 20e-6};
  return t;
}

DenseModule Mlp(const std::string& name, double params, double flops, double act = 0) {
  DenseModule m;
  m.name = name;
  m.params = static_cast<int64_t>(params);
  m.flops_per_sample = flops;
  m.activation_bytes_per_sample = act;
  m.io_bytes_per_sample = 1024;
  return m;
}

Table MakeTable(const std::string& name, double rows, int dim, double pooling = 1) {
  Table t;
  t.name = name;
  t.rows = static_cast<int64_t>(rows);
  t.dim = dim;
  t.pooling_factor = pooling;
  return t;
}

PlanRequest Request(int local_batch) {
  PlanRequest r;
  r.model.name = "test";
  r.local_batch = local_batch;
  r.options.hbm_reserve_fraction = 0;
  return r;
}

const Decision* FindDecision(const Plan& plan, const std::string& prefix) {
  for (const Decision& d : plan.decisions) {
    if (d.dimension.rfind(prefix, 0) == 0) return &d;
  }
  return nullptr;
}

// One node of two GPUs, one 1e9-parameter module, no tables. Plain data
// parallelism (G=1) needs 1e9 x (4 master + 8 Adam + 4 grad) = 16 GB of
// shards (a group of one gathers nothing) plus 0.1 GB of activations, over
// a 14 GiB (15.03 GB) GPU. FSDP over both GPUs halves the shards and adds
// 2 GB gathered weights and 2 GB of unsharded gradients: 2 + 6 + 4 = 12 GB
// fits. Its all-gather (2 GB of bf16, 1 GB received at
// 100 GB/s plus 5 us) has no earlier compute to hide behind, nor has the
// reduce-scatter: 2 x 10.005 ms exposed on NVLink. The optimizer streams
// 28 bytes per shard parameter (read 4 + 4 + 8, write 4 + 8) at the
// elementwise 25% of 3 TB/s: 0.5e9 x 28 / 0.75e12 = 18.67 ms.
TEST(PlannerTest, HandWorkedTwoGpuPlan) {
  Topology t = MakeTopology(1, 2, 1, 14);
  PlanRequest r = Request(100);
  r.model.modules.push_back(Mlp("mlp", 1e9, 2e9, /*act=*/1e6));
  absl::StatusOr<Plan> plan = MakePlan(t, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->dense.fsdp_group, 2);
  EXPECT_EQ(plan->dense.replicas, 1);
  const double compute = 3 * 2e9 * 100 / (1e15 * 0.6);
  const double optimizer = 0.5e9 * 28 / (3e12 * 0.25);
  EXPECT_NEAR(plan->step.dense_compute_s, compute, 1e-12);
  EXPECT_NEAR(plan->step.optimizer_s, optimizer, 1e-12);
  EXPECT_NEAR(plan->step.exposed_s[kNvlink], 2 * (5e-6 + 1e9 / 100e9), 1e-12);
  EXPECT_NEAR(plan->step.total_s, compute + optimizer + 2 * (5e-6 + 1e9 / 100e9), 1e-12);
  EXPECT_NEAR(plan->step.scaling_ratio, (compute + optimizer) / plan->step.total_s, 1e-12);
  EXPECT_DOUBLE_EQ(plan->peak.dense, 0.5e9 * 4);
  EXPECT_DOUBLE_EQ(plan->peak.optimizer, 0.5e9 * 12);
  EXPECT_DOUBLE_EQ(plan->peak.buffers, 2e9 + 2e9);
  EXPECT_DOUBLE_EQ(plan->peak.activations, 1e6 * 100);
  const Decision* mesh = FindDecision(*plan, "dense mesh");
  ASSERT_NE(mesh, nullptr);
  ASSERT_EQ(mesh->alternatives.size(), 1u);
  EXPECT_FALSE(mesh->alternatives[0].feasible);
  EXPECT_NE(mesh->alternatives[0].note.find("over HBM"), std::string::npos);

  // With room for plain data parallelism (G=1), its gradient all-reduce of
  // 2 GB between the two GPUs costs exactly the all-gather plus the
  // reduce-scatter it replaces, but its optimizer steps every parameter,
  // not half of them: FSDP wins by one more optimizer time.
  t.hbm_bytes_per_gpu = 40 * kGiB;
  plan = MakePlan(t, r);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->dense.fsdp_group, 2);
  mesh = FindDecision(*plan, "dense mesh");
  ASSERT_EQ(mesh->alternatives.size(), 1u);
  EXPECT_TRUE(mesh->alternatives[0].feasible);
  EXPECT_NEAR(mesh->alternatives[0].step_s, plan->step.total_s + optimizer, 1e-12);
  EXPECT_GT(mesh->alternatives[0].peak_bytes, plan->peak.Total());
}

// Two regions: "cheap" recomputes 1 ms per GB saved, "dear" 10 ms per GB.
// When 1 GB must go, all of it comes out of "cheap".
TEST(PlannerTest, CheckpointCutsCheapestRecomputeFirst) {
  Topology t = MakeTopology(1, 1, 1, 10);
  PlanRequest r = Request(1000);
  DenseModule cheap = Mlp("cheap", 1000, 1.2e9);  // 1000 samples: 2 ms forward at 0.6 PFLOP/s.
  cheap.activation_bytes_per_sample = 2e6;                            // 2 GB.
  cheap.io_bytes_per_sample = 0;
  DenseModule dear = Mlp("dear", 1000, 1.2e10);  // 20 ms forward.
  dear.activation_bytes_per_sample = 2e6;
  dear.io_bytes_per_sample = 0;
  r.model.modules = {dear, cheap};
  // Leave exactly 3 GB for activations (a group of one gathers nothing).
  t.hbm_bytes_per_gpu = 3e9 + 2 * 1000 * 16;
  absl::StatusOr<Plan> plan = MakePlan(t, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->checkpoint.size(), 2u);
  EXPECT_EQ(plan->checkpoint[0].region, "cheap");
  EXPECT_NEAR(plan->checkpoint[0].budget_bytes, 1e9, 1e3);
  EXPECT_NEAR(plan->checkpoint[0].recompute_s, 1e-3, 1e-9);
  EXPECT_DOUBLE_EQ(plan->checkpoint[1].budget_bytes, 2e9);
  EXPECT_NEAR(plan->step.recompute_s, 1e-3, 1e-9);
}

// The job's activation budget on plenty of HBM, with the cheap region made
// of 4 identical blocks (0.5 GB each) and the dear one not recomputable:
// a 3.4 GB budget needs 0.6 GB cut, so 2 whole blocks of "cheap" are
// recomputed (1 GB saved, half its 2 ms forward), never a part of one and
// nothing of "dear"; the predicted activations are exactly what is kept.
// Naming "cheap" instead recomputes all 4 blocks with no budget, and keeps
// one block's 0.5 GB: the last block's backward comes first and brings its
// activations back at the peak. A budget below the non-recomputable 2 GB
// plus that block fails, naming the budget.
TEST(PlannerTest, ActivationBudgetRecomputesWholeBlocksCheapestFirst) {
  Topology t = MakeTopology(1, 1, 1, 100);
  PlanRequest r = Request(1000);
  DenseModule cheap = Mlp("cheap", 1000, 1.2e9);
  cheap.activation_bytes_per_sample = 2e6;
  cheap.io_bytes_per_sample = 0;
  cheap.recompute_units = 4;
  DenseModule dear = Mlp("dear", 1000, 1.2e8);  // Cheaper per byte, but not recomputable.
  dear.activation_bytes_per_sample = 2e6;
  dear.io_bytes_per_sample = 0;
  dear.recomputable = false;
  r.model.modules = {dear, cheap};
  r.activation_budget_bytes = 3.4e9;
  absl::StatusOr<Plan> plan = MakePlan(t, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->checkpoint.size(), 2u);
  EXPECT_EQ(plan->checkpoint[0].region, "cheap");
  EXPECT_EQ(plan->checkpoint[0].units, 4);
  EXPECT_EQ(plan->checkpoint[0].recomputed_units, 2);
  EXPECT_NEAR(plan->checkpoint[0].budget_bytes, 1e9, 1e3);
  EXPECT_NEAR(plan->checkpoint[0].recompute_s, 1e-3, 1e-9);
  EXPECT_DOUBLE_EQ(plan->checkpoint[1].budget_bytes, 2e9);
  EXPECT_EQ(plan->checkpoint[1].recomputed_units, 0);
  EXPECT_NEAR(plan->peak.activations, 3e9, 1e3);
  const Decision* ckpt = FindDecision(*plan, "activation checkpointing");
  ASSERT_NE(ckpt, nullptr);
  EXPECT_NE(ckpt->chosen.find("cheap: 2 of 4 blocks recomputed"), std::string::npos) << ckpt->chosen;
  EXPECT_NE(ckpt->reason.find("activation_memory.budget_bytes"), std::string::npos) << ckpt->reason;

  r.activation_budget_bytes = 0;
  r.recompute_regions = {"cheap"};
  plan = MakePlan(t, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->checkpoint[0].recomputed_units, 4);
  EXPECT_NEAR(plan->checkpoint[0].budget_bytes, 0.5e9, 1e3);
  EXPECT_NEAR(plan->peak.activations, 2.5e9, 1e3);
  EXPECT_NEAR(plan->step.recompute_s, 2e-3, 1e-9);

  r.recompute_regions = {"dear"};
  EXPECT_EQ(MakePlan(t, r).status().code(), absl::StatusCode::kInvalidArgument);
  r.recompute_regions.clear();
  r.activation_budget_bytes = 2.4e9;
  const absl::Status over = MakePlan(t, r).status();
  EXPECT_FALSE(over.ok());
  EXPECT_NE(over.message().find("budget"), std::string::npos) << over;
  // The first fix is the budget itself: what the activations need at least.
  EXPECT_NE(over.message().find("Fix: raise activation_memory.budget_bytes to at least 25"), std::string::npos)
      << over;
}

TEST(PlannerTest, NothingFitsNamesTableOverageAndFix) {
  Topology t = MakeTopology(1, 8, 1, 1);
  PlanRequest r = Request(16);
  r.model.modules.push_back(Mlp("mlp", 1e6, 2e6));
  r.model.tables.push_back(MakeTable("giant_item_ids", 1e9, 128));
  absl::StatusOr<Plan> plan = MakePlan(t, r);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string msg(plan.status().message());
  EXPECT_NE(msg.find("giant_item_ids"), std::string::npos) << msg;
  EXPECT_NE(msg.find("over by"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Fix"), std::string::npos) << msg;
}

TEST(PlannerTest, NothingFitsNamesActivationsAndBatchFix) {
  Topology t = MakeTopology(1, 8, 1, 4);
  PlanRequest r = Request(4096);
  DenseModule m = Mlp("tower", 1e6, 2e6, 4e6);
  m.io_bytes_per_sample = 2e6;  // Even checkpointed, 8 GB of inputs.
  r.model.modules.push_back(m);
  r.model.tables.push_back(MakeTable("small", 1000, 16));
  absl::StatusOr<Plan> plan = MakePlan(t, r);
  ASSERT_FALSE(plan.ok());
  const std::string msg(plan.status().message());
  EXPECT_NE(msg.find("region 'tower'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lower batch.local from 4096 to"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(precision.kept_activations: fp8)"), std::string::npos) << msg;

  // A job file names its settings otherwise, and lacks some: the fixes
  // speak its names and offer nothing it cannot set.
  r.setting_names.local_batch = "spec.data.local_batch_size";
  r.setting_names.fp8_kept_activations = "";
  plan = MakePlan(t, r);
  ASSERT_FALSE(plan.ok());
  const std::string job(plan.status().message());
  EXPECT_NE(job.find("lower spec.data.local_batch_size from 4096 to"), std::string::npos) << job;
  EXPECT_EQ(job.find("batch.local"), std::string::npos) << job;
  EXPECT_EQ(job.find("FP8"), std::string::npos) << job;
}

// GEM: a large expert MLP whose all-gather cannot hide behind the previous
// module's compute gets expert parallelism.
TEST(GemScenarioTest, ExposedExpertAllGatherGetsExpertParallelism) {
  Topology t = MakeTopology(4, 8, 4, 141);
  PlanRequest r = Request(256);
  r.model.modules.push_back(Mlp("embed_proj", 1e6, 2e6));  // Microseconds of compute.
  DenseModule experts = Mlp("experts", 8e9, 1.6e10);
  experts.num_experts = 16;
  r.model.modules.push_back(experts);
  r.model.tables.push_back(MakeTable("ids", 1e6, 64));
  absl::StatusOr<Plan> plan = MakePlan(t, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->dense.experts.size(), 1u);
  EXPECT_GT(plan->dense.experts[0].ep_degree, 1);
  const Decision* ep = FindDecision(*plan, "expert parallelism");
  ASSERT_NE(ep, nullptr);
  bool saw_plain = false;
  for (const Alternative& a : ep->alternatives) {
    if (a.option.rfind("no EP", 0) != 0) continue;
    saw_plain = true;
    EXPECT_GT(a.step_s, plan->step.total_s);
    EXPECT_NE(a.note.find("exposed"), std::string::npos) << a.note;
  }
  EXPECT_TRUE(saw_plain);

  // The same experts behind a long attention block hide their all-gather;
  // EP would only add activation traffic, so it is not used.
  r.model.modules[0].flops_per_sample = 2e12;
  r.model.modules[0].params = 1e6;
  plan = MakePlan(t, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->dense.experts[0].ep_degree, 1);
}

Model GemLite() {
  Model m;
  m.name = "gem-lite";
  m.sequence_lengths = {{128, 0.5}, {512, 0.4}, {2048, 0.1}};
  DenseModule seq = Mlp("seq", 25e6, 0);
  seq.op = OpKind::kAttention;
  seq.flops_per_token = 5e7;
  seq.flops_per_token_sq = 4096;
  seq.activation_bytes_per_token = 16384;
  m.modules.push_back(seq);
  DenseModule ex = Mlp("experts", 400e6, 8e8, 65536);
  ex.num_experts = 8;
  m.modules.push_back(ex);
  m.modules.push_back(Mlp("heads", 2e6, 4e6, 4096));
  Table item = MakeTable("item", 2e8, 128, 400);
  item.pooled = false;
  m.tables.push_back(item);
  for (int i = 0; i < 20; ++i) m.tables.push_back(MakeTable("f" + std::to_string(i), 5e6, 64, 10));
  return m;
}

// GEM: only gradient all-reduce crosses zones.
TEST(GemScenarioTest, CrossZoneTrafficIsOnlyGradientAllReduce) {
  Topology t = MakeTopology(8, 8, 2, 80);  // 4 zones of 16 GPUs.
  PlanRequest r = Request(512);
  r.model = GemLite();
  absl::StatusOr<Plan> plan = MakePlan(t, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int crossing = 0;
  for (const CommOp& op : plan->comm) {
    if (op.highest_level != kCrossZone) continue;
    ++crossing;
    EXPECT_TRUE(op.gradient_sync) << op.name;
    EXPECT_EQ(op.collective, Collective::kAllReduce) << op.name;
  }
  EXPECT_GT(crossing, 0);  // The replica all-reduce does cross.
  const Decision* sparse = FindDecision(*plan, "sparse layout");
  ASSERT_NE(sparse, nullptr);
  bool v1_rejected = false;
  for (const Alternative& a : sparse->alternatives) {
    if (a.option.rfind("V1", 0) == 0) {
      v1_rejected = !a.feasible && a.note.find("cross-zone") != std::string::npos;
    }
  }
  EXPECT_TRUE(v1_rejected);
}

// GEM: when a full table copy per model-parallel group does not fit, V3
// shards it further across groups over NVLink.
TEST(GemScenarioTest, V3WhenReplicatedTablesDoNotFit) {
  Topology t = MakeTopology(4, 8, 2, 16);  // 2 zones of 16 GPUs.
  PlanRequest r = Request(64);
  r.options.max_model_parallel_group = 4;
  r.model.modules.push_back(Mlp("mlp", 1e6, 2e6, 1000));
  // 16 tables of 7.8 GB: 125 GB per copy. A V2 group (at most 4 ranks) would
  // hold 31 GB per GPU, over 16 GiB; V1 would put all-to-alls across zones.
  // V3 splits each group's shards 4- or 8-way inside a node: 7.8 GB per GPU.
  for (int i = 0; i < 16; ++i) r.model.tables.push_back(MakeTable("t" + std::to_string(i), 3e7, 64));
  absl::StatusOr<Plan> plan = MakePlan(t, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->sparse.scheme, SparseScheme::kV3);
  EXPECT_GT(plan->sparse.v3_shard_degree, 1);
  const Decision* sparse = FindDecision(*plan, "sparse layout");
  ASSERT_NE(sparse, nullptr);
  for (const Alternative& a : sparse->alternatives) {
    if (a.option.rfind("V2", 0) == 0) {
      EXPECT_FALSE(a.feasible) << a.option;
    }
  }
  for (const MemoryBreakdown& m : plan->rank_memory) {
    EXPECT_LE(m.Total(), plan->hbm_usable_bytes * (1 + 1e-12));
  }
}

// Fleets that are not powers of two, and multi-node NVLink domains.
TEST(PlannerTest, OddFleetsPlanWithinHbm) {
  struct Shape {
    int nodes, gpus, nodes_per_domain, nodes_per_zone;
  };
  for (const Shape& shape : {Shape{3, 8, 1, 3}, Shape{18, 4, 18, 18}, Shape{6, 8, 1, 2},
                             Shape{12, 4, 2, 6}}) {
    Topology t = MakeTopology(shape.nodes, shape.gpus, shape.nodes_per_zone, 80);
    t.nodes_per_nvlink_domain = shape.nodes_per_domain;
    PlanRequest r = Request(256);
    r.model = GemLite();
    absl::StatusOr<Plan> plan = MakePlan(t, r);
    ASSERT_TRUE(plan.ok()) << shape.nodes << "x" << shape.gpus << ": " << plan.status();
    EXPECT_EQ(t.WorldSize() % plan->dense.fsdp_group, 0);
    EXPECT_EQ(t.WorldSize() % (plan->sparse.mp_group * plan->sparse.v3_shard_degree), 0);
    for (const MemoryBreakdown& m : plan->rank_memory) {
      EXPECT_LE(m.Total(), plan->hbm_usable_bytes * (1 + 1e-12));
    }
    for (const CommOp& op : plan->comm) {
      if (op.highest_level == kCrossZone) {
        EXPECT_TRUE(op.gradient_sync) << op.name;
      }
    }
  }
}

// Random small jobs for the property tests; a fixed seed keeps CI stable.
PlanRequest RandomJob(std::mt19937* rng) {
  std::uniform_real_distribution<double> u(0, 1);
  PlanRequest r = Request(64 << static_cast<int>(u(*rng) * 4));
  r.model.sequence_lengths = {{64 + 1000 * u(*rng), 0.7}, {4000 * u(*rng), 0.3}};
  const int modules = 1 + static_cast<int>(u(*rng) * 5);
  for (int i = 0; i < modules; ++i) {
    DenseModule m = Mlp("m" + std::to_string(i), 1e6 + 2e9 * u(*rng) * u(*rng), 1e7 + 4e9 * u(*rng),
                        1e4 + 2e6 * u(*rng));
    if (u(*rng) < 0.3) m.num_experts = 8;
    if (u(*rng) < 0.3) {
      m.op = OpKind::kAttention;
      m.flops_per_token_sq = 2048;
      m.activation_bytes_per_token = 4096 * u(*rng);
    }
    m.region = "r" + std::to_string(static_cast<int>(u(*rng) * 3));
    r.model.modules.push_back(m);
  }
  const int tables = 1 + static_cast<int>(u(*rng) * 30);
  for (int i = 0; i < tables; ++i) {
    Table tab = MakeTable("t" + std::to_string(i), 1e3 + 2e8 * u(*rng) * u(*rng) * u(*rng),
                          16 << static_cast<int>(u(*rng) * 4), 1 + 50 * u(*rng));
    tab.access_frequency = u(*rng);
    tab.pooled = u(*rng) < 0.8;
    r.model.tables.push_back(tab);
  }
  return r;
}

TEST(PlannerPropertyTest, NeverOverHbmDeterministicAndMonotoneInBandwidth) {
  std::mt19937 rng(20261129);
  const Topology base = MakeTopology(4, 4, 2, 40);
  int planned = 0;
  for (int trial = 0; trial < 25; ++trial) {
    PlanRequest r = RandomJob(&rng);
    r.options.hbm_reserve_fraction = 0.05;
    absl::StatusOr<Plan> plan = MakePlan(base, r);
    if (!plan.ok()) {
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
      continue;
    }
    ++planned;
    for (const MemoryBreakdown& m : plan->rank_memory) {
      EXPECT_LE(m.Total(), plan->hbm_usable_bytes * (1 + 1e-12)) << "trial " << trial;
    }
    EXPECT_LE(plan->peak.Total(), plan->hbm_usable_bytes * (1 + 1e-12));
    absl::StatusOr<Plan> again = MakePlan(base, r);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(FormatJson(*plan), FormatJson(*again)) << "trial " << trial;
    for (int level = 0; level < kNumLevels; ++level) {
      Topology fast = base;
      fast.links[level].bandwidth_bytes_per_s *= 2;
      fast.links[level].latency_s /= 2;
      absl::StatusOr<Plan> quicker = MakePlan(fast, r);
      ASSERT_TRUE(quicker.ok()) << quicker.status();
      EXPECT_LE(quicker->step.total_s, plan->step.total_s * (1 + 1e-12))
          << "trial " << trial << " level " << LinkLevelName(level);
    }
  }
  EXPECT_GE(planned, 10);
}

// A rate table's activations hold each rank's own lookups and ids. One
// rank: 100 samples x 10 ids of a pooled 64-wide table send 100 x 64 x 2 B
// of outputs, receive as much and send 1,000 x 8 B of ids; with the flag
// none of it is a buffer (no all-to-all). Two ranks sharing the table over
// an all-to-all: only the one copy of the rank's own lookups leaves.
TEST(PlannerTest, LookupsHeldByTheActivationsAreNotBuffersToo) {
  PlanRequest r = Request(100);
  r.model.modules.push_back(Mlp("a", 1e6, 2e6, /*act=*/1e5));
  r.model.tables.push_back(MakeTable("t", 1e6, 64, 10));
  absl::StatusOr<Plan> counted = MakePlan(MakeTopology(1, 1, 1, 16), r);
  ASSERT_TRUE(counted.ok()) << counted.status();
  EXPECT_DOUBLE_EQ(counted->peak.buffers, 2 * 100 * 64 * 2 + 1000 * 8);
  r.activations_hold_lookups = true;
  absl::StatusOr<Plan> held = MakePlan(MakeTopology(1, 1, 1, 16), r);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_DOUBLE_EQ(held->peak.buffers, 0);
  EXPECT_DOUBLE_EQ(held->peak.Total(), counted->peak.Total() - counted->peak.buffers);

  r.hints.table_sharding_group_size = 2;
  absl::StatusOr<Plan> two_held = MakePlan(MakeTopology(1, 2, 1, 16), r);
  r.activations_hold_lookups = false;
  absl::StatusOr<Plan> two_counted = MakePlan(MakeTopology(1, 2, 1, 16), r);
  ASSERT_TRUE(two_held.ok()) << two_held.status();
  ASSERT_TRUE(two_counted.ok()) << two_counted.status();
  ASSERT_EQ(two_counted->sparse.mp_group, 2);
  ASSERT_EQ(two_held->sparse.mp_group, 2);
  const std::vector<double>& out = two_counted->sparse.sharding.rank_out_bytes;
  ASSERT_EQ(out.size(), 2u);
  // Row-wise: each rank's shard returns a full-width partial sum for all 200
  // samples, so a rank receives two copies of its own lookups, and the
  // activations hold only one of them.
  EXPECT_DOUBLE_EQ(out[0], 200 * 64 * 2);
  EXPECT_DOUBLE_EQ(out[1], 200 * 64 * 2);
  EXPECT_DOUBLE_EQ(two_held->peak.buffers, two_counted->peak.buffers - 100 * 64 * 2);
}

// A backward's scratch (DenseModule::backward_scratch_bytes_per_sample) is
// one call's, freed before the next module's backward: the largest module's
// is a buffer (100 samples x 3e4 B, not both modules' sum), which
// checkpointing cannot cut, so it takes its room from the activations. Two
// modules of 1e6 parameters keep 2 x 16e6 B of shards and 2 x 1e7 B of
// activations; 0.05 GiB (53.7e6 B) holds them without the scratch, and
// with it 1.3e6 B of activations are recomputed.
TEST(PlannerTest, LargestBackwardScratchIsABufferBesideTheActivations) {
  PlanRequest r = Request(100);
  r.model.modules.push_back(Mlp("a", 1e6, 2e6, /*act=*/1e5));
  r.model.modules.push_back(Mlp("b", 1e6, 2e6, /*act=*/1e5));
  const Topology t = MakeTopology(1, 1, 1, 0.05);
  absl::StatusOr<Plan> plain = MakePlan(t, r);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_DOUBLE_EQ(plain->peak.buffers, 0);
  EXPECT_DOUBLE_EQ(plain->peak.activations, 2 * 1e5 * 100);
  r.model.modules[0].backward_scratch_bytes_per_sample = 1e4;
  r.model.modules[1].backward_scratch_bytes_per_sample = 3e4;
  absl::StatusOr<Plan> scratch = MakePlan(t, r);
  ASSERT_TRUE(scratch.ok()) << scratch.status();
  EXPECT_DOUBLE_EQ(scratch->peak.buffers, 100 * 3e4);
  const double usable = 0.05 * kGiB;
  EXPECT_NEAR(scratch->peak.activations, usable - 2 * 16e6 - 100 * 3e4, 1);
  EXPECT_NEAR(scratch->peak.Total(), usable, 1);
}

}  // namespace
}  // namespace recfleet::planner

namespace recfleet::planner {
namespace {

// Synchronous collectives (Gloo CPU workers): nothing hides, so the step is
// compute plus every collective's full alpha-beta time. Four ranks sharing
// two cores compute at half the per-core rate.
TEST(PlannerTest, SynchronousCollectivesAndSharedCores) {
  Topology t = MakeTopology(1, 4, 1, 16);
  PlanRequest r = Request(64);
  r.model.modules.push_back(Mlp("a", 1e6, 2e6));
  r.model.modules.push_back(Mlp("b", 1e6, 2e6));
  r.model.tables.push_back(MakeTable("t", 1e4, 16, 2));
  absl::StatusOr<Plan> overlapped = MakePlan(t, r);
  ASSERT_TRUE(overlapped.ok()) << overlapped.status();
  r.options.overlap_collectives = false;
  absl::StatusOr<Plan> plan = MakePlan(t, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  double comm = 0;
  for (const CommOp& op : plan->comm) {
    EXPECT_DOUBLE_EQ(op.exposed_s, op.cost.seconds) << op.name;
    comm += op.cost.seconds;
  }
  EXPECT_GT(comm, 0);
  EXPECT_NEAR(plan->step.total_s, plan->step.ComputeS() + plan->step.recompute_s + comm, 1e-12);
  EXPECT_GE(plan->step.total_s, overlapped->step.total_s);

  t.cpu_cores_per_node = 2;
  absl::StatusOr<Plan> shared = MakePlan(t, r);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_NEAR(shared->step.dense_compute_s, 2 * plan->step.dense_compute_s, 1e-15);
  EXPECT_NEAR(shared->step.sparse_compute_s, 2 * plan->step.sparse_compute_s, 1e-15);
  EXPECT_NEAR(shared->step.optimizer_s, 2 * plan->step.optimizer_s, 1e-15);
  // Loopback copies are work for the same two cores.
  EXPECT_NEAR(shared->step.ExposedS(), 2 * plan->step.ExposedS(), 1e-12);
}

TEST(PlannerTest, RankSyncAddsItsMeasuredFractionOfComputeOnMoreThanOneRank) {
  PlanRequest r = Request(64);
  r.model.modules.push_back(Mlp("a", 1e6, 2e6));
  r.model.tables.push_back(MakeTable("t", 1e4, 16, 2));
  absl::StatusOr<Plan> without = MakePlan(MakeTopology(1, 4, 1, 16), r);
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_EQ(without->step.rank_sync_s, 0);
  r.rank_sync_fraction = 0.25;
  absl::StatusOr<Plan> four = MakePlan(MakeTopology(1, 4, 1, 16), r);
  ASSERT_TRUE(four.ok()) << four.status();
  const StepTime& st = four->step;
  EXPECT_NEAR(st.rank_sync_s, 0.25 * (st.ComputeS() + st.recompute_s), 1e-15);
  EXPECT_NEAR(st.total_s, st.ComputeS() + st.recompute_s + st.ExposedS() + st.rank_sync_s, 1e-15);
  EXPECT_GT(st.total_s, without->step.total_s);
  // Waiting is not compute: the scaling ratio drops.
  EXPECT_LT(st.scaling_ratio, without->step.scaling_ratio);
  absl::StatusOr<Plan> one = MakePlan(MakeTopology(1, 1, 1, 16), r);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->step.rank_sync_s, 0);
  r.rank_sync_fraction = -0.1;
  EXPECT_FALSE(MakePlan(MakeTopology(1, 4, 1, 16), r).ok());
}

}  // namespace
}  // namespace recfleet::planner
