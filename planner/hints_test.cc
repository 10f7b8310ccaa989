// The job's parallelism hints as planner constraints: honored, explained
// with their cost against the planner's own choice, and rejected with the
// field named when the fleet cannot form them.

#include <string>

#include "gtest/gtest.h"
#include "planner/planner.h"

namespace recfleet::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

Topology Fleet(int nodes, int nodes_per_zone) {
  Topology t;
  t.name = "hints";
  t.num_nodes = nodes;
  t.gpus_per_node = 8;
  t.nodes_per_zone = nodes_per_zone;
  t.hbm_bytes_per_gpu = 80 * kGiB;
  t.peak_flops_per_gpu = 1e15;
  t.hbm_bandwidth_bytes_per_s = 3e12;
  t.links[kNvlink] = {100e9, 5e-6};
  t.links[kZone] = {25e9, 10e-6};
  t.links[kCrossZone] = {5e9, 20e-6};
  return t;
}

PlanRequest Job() {
  PlanRequest r;
  r.model.name = "hints";
  r.local_batch = 256;
  DenseModule mlp;
  mlp.name = "mlp";
  mlp.params = 200'000'000;
  mlp.flops_per_sample = 4e8;
  mlp.activation_bytes_per_sample = 1e5;
  mlp.io_bytes_per_sample = 2048;
  r.model.modules.push_back(mlp);
  for (int i = 0; i < 6; ++i) {
    Table t;
    t.name = "t" + std::to_string(i);
    t.rows = 20'000'000;
    t.dim = 64;
    t.pooling_factor = 8;
    r.model.tables.push_back(t);
  }
  return r;
}

const Decision* FindDecision(const Plan& plan, const std::string& prefix) {
  for (const Decision& d : plan.decisions) {
    if (d.dimension.rfind(prefix, 0) == 0) return &d;
  }
  return nullptr;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(HintsTest, HintedFsdpGroupIsUsedAndItsCostExplained) {
  const Topology t = Fleet(2, 2);
  PlanRequest r = Job();
  absl::StatusOr<Plan> own = MakePlan(t, r);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(FindDecision(*own, "parallelism hints"), nullptr);

  const int hinted = own->dense.fsdp_group == 2 ? 4 : 2;
  r.hints.fsdp_group_size = hinted;
  absl::StatusOr<Plan> plan = MakePlan(t, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->dense.fsdp_group, hinted);
  EXPECT_EQ(plan->dense.replicas, 16 / hinted);
  // The layout is still the planner's choice: the best one for that mesh.
  EXPECT_GE(plan->step.total_s, own->step.total_s);

  const Decision* mesh = FindDecision(*plan, "dense mesh");
  ASSERT_NE(mesh, nullptr);
  EXPECT_EQ(mesh->chosen, "FSDP group " + std::to_string(hinted));
  EXPECT_EQ(mesh->reason.rfind("set by the job's hints (parallelism.fsdp_group_size = " +
                                   std::to_string(hinted) + ")",
                               0),
            0u)
      << mesh->reason;
  // The other group sizes stay listed, with what they would cost.
  bool lists_own = false;
  for (const Alternative& a : mesh->alternatives) {
    lists_own |= a.option == "FSDP group " + std::to_string(own->dense.fsdp_group);
  }
  EXPECT_TRUE(lists_own);

  const Decision* cost = FindDecision(*plan, "parallelism hints");
  ASSERT_NE(cost, nullptr);
  EXPECT_EQ(cost->chosen, "parallelism.fsdp_group_size = " + std::to_string(hinted));
  EXPECT_TRUE(Contains(cost->reason, "the hints cost")) << cost->reason;
  ASSERT_EQ(cost->alternatives.size(), 1u);
  // The planner's own best, as quoted, is exactly the unhinted plan.
  EXPECT_DOUBLE_EQ(cost->alternatives[0].step_s, own->step.total_s);
  EXPECT_DOUBLE_EQ(cost->alternatives[0].peak_bytes, own->peak.Total());
  EXPECT_TRUE(Contains(cost->alternatives[0].option, "FSDP group " +
                                                         std::to_string(own->dense.fsdp_group)));
}

TEST(HintsTest, ReplicasAndTableGroupFixTheMeshAndLayout) {
  const Topology t = Fleet(2, 2);
  PlanRequest r = Job();
  r.hints.replicas = 4;
  r.hints.table_sharding_group_size = 8;
  absl::StatusOr<Plan> plan = MakePlan(t, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->dense.fsdp_group, 4);
  EXPECT_EQ(plan->sparse.scheme, SparseScheme::kV2);
  EXPECT_EQ(plan->sparse.mp_group, 8);
  EXPECT_EQ(plan->sparse.mp_stride, 1);
  EXPECT_EQ(plan->sparse.table_copies, 2);
  const Decision* layout = FindDecision(*plan, "sparse layout");
  ASSERT_NE(layout, nullptr);
  EXPECT_TRUE(Contains(layout->reason,
                       "set by the job's hints (parallelism.table_sharding_group_size = 8)"));
  const Decision* mesh = FindDecision(*plan, "dense mesh");
  EXPECT_TRUE(Contains(mesh->reason, "parallelism.replicas = 4 (FSDP groups of 4)"));

  // A table group of the whole fleet is V1.
  r.hints.table_sharding_group_size = 16;
  plan = MakePlan(t, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->sparse.scheme, SparseScheme::kV1);
  EXPECT_EQ(plan->sparse.mp_group, 16);
}

TEST(HintsTest, HintsMatchingThePlannersChoiceSaySo) {
  const Topology t = Fleet(2, 2);
  PlanRequest r = Job();
  absl::StatusOr<Plan> own = MakePlan(t, r);
  ASSERT_TRUE(own.ok()) << own.status();
  r.hints.fsdp_group_size = own->dense.fsdp_group;
  absl::StatusOr<Plan> plan = MakePlan(t, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_DOUBLE_EQ(plan->step.total_s, own->step.total_s);
  const Decision* cost = FindDecision(*plan, "parallelism hints");
  ASSERT_NE(cost, nullptr);
  EXPECT_TRUE(Contains(cost->reason, "match the planner's own choice")) << cost->reason;
  EXPECT_TRUE(cost->alternatives.empty());
}

TEST(HintsTest, ImpossibleHintsNameTheField) {
  const Topology t = Fleet(3, 3);  // 24 ranks.
  struct Case {
    ParallelismHints hints;
    const char* want;
  } cases[] = {
      {{5, 0, 0}, "parallelism.fsdp_group_size: 5 does not divide the world size (24 ranks)"},
      {{0, 7, 0}, "parallelism.replicas: 7 does not divide the world size (24 ranks)"},
      {{0, 0, 9}, "parallelism.table_sharding_group_size: 9 does not divide the world size"},
      // 12 ranks: more than a node of 8, not whole nodes.
      {{12, 0, 0}, "parallelism.fsdp_group_size: a group of 12 ranks does not nest"},
      {{0, 2, 0}, "parallelism.replicas: a group of 12 ranks does not nest"},
      {{4, 3, 0},
       "parallelism.fsdp_group_size (4) x parallelism.replicas (3) must equal the world size "
       "(24), got 12"},
      {{-1, 0, 0}, "parallelism.fsdp_group_size must be >= 0"},
  };
  for (const Case& c : cases) {
    PlanRequest r = Job();
    r.hints = c.hints;
    absl::StatusOr<Plan> plan = MakePlan(t, r);
    ASSERT_FALSE(plan.ok()) << c.want;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
    EXPECT_TRUE(Contains(std::string(plan.status().message()), c.want)) << plan.status();
  }
  PlanRequest r = Job();
  r.hints.fsdp_group_size = 12;
  const std::string msg(MakePlan(t, r).status().message());
  EXPECT_TRUE(Contains(msg, "Valid values: 1, 2, 4, 8, 24")) << msg;
}

TEST(HintsTest, HintsThatCannotFitSayWhatIsOverAndHowToFix) {
  // Zones of 16: a hinted FSDP group of 32 would all-gather across zones.
  const Topology t = Fleet(4, 2);
  PlanRequest r = Job();
  r.hints.fsdp_group_size = 32;
  absl::StatusOr<Plan> plan = MakePlan(t, r);
  ASSERT_FALSE(plan.ok());
  std::string msg(plan.status().message());
  EXPECT_TRUE(Contains(msg, "with the job's hints (parallelism.fsdp_group_size = 32)")) << msg;
  EXPECT_TRUE(Contains(msg, "cross-zone")) << msg;
  r.options.allow_cross_zone_non_gradient = true;
  plan = MakePlan(t, r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->dense.fsdp_group, 32);

  // One rank cannot hold the tables (6 x 20M x 64 fp32 = 30.7 GB, plus
  // optimizer rows) next to the 200M-parameter replica on a 24 GiB GPU.
  Topology small = Fleet(2, 2);
  small.hbm_bytes_per_gpu = 24 * kGiB;
  r = Job();
  r.hints.table_sharding_group_size = 1;
  plan = MakePlan(small, r);
  ASSERT_FALSE(plan.ok());
  msg = std::string(plan.status().message());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << msg;
  EXPECT_TRUE(Contains(msg, "parallelism.table_sharding_group_size = 1")) << msg;
  EXPECT_TRUE(Contains(msg, "leave it unset")) << msg;
}

}  // namespace
}  // namespace recfleet::planner
