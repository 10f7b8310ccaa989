#include "worker/distributed_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/testing/compare.h"
#include "engine/testing/movielens.h"
#include "engine/testing/synthetic.h"
#include "gtest/gtest.h"
#include "worker/dist/gloo_ranks_testing.h"
#include "worker/single_rank_model.h"

namespace recfleet::worker {
namespace {

constexpr int kWorld = 4;
constexpr int kSteps = 20;

engine::MovieLensCtr Data() {
  engine::SyntheticOptions s;
  s.num_users = 40;
  s.num_items = 60;
  s.min_events = 4;
  s.mean_extra_events = 10;
  engine::CtrOptions o;
  o.max_history = 6;
  return *engine::MovieLensCtr::Create(engine::SyntheticMovieLens(s), o);
}

engine::GemLiteConfig Config() {
  engine::GemLiteConfig c;
  c.dim = 8;
  c.heads = 2;
  c.seq_layers = 1;
  c.pma_queries = 2;
  c.dcn_layers = 1;
  c.num_experts = 2;
  c.expert_hidden = 8;
  c.expert_out = 6;
  c.tower_hidden = 4;
  return c;
}

// Rank r's samples of step s: 2 + (r + s) % 3 of them (uneven on purpose),
// after the lower ranks' in one global order.
std::vector<int64_t> Samples(const engine::MovieLensCtr& data, int step, int rank) {
  std::vector<int64_t> out;
  int64_t next = static_cast<int64_t>(step) * 17;
  for (int r = 0; r <= rank; ++r) {
    const int n = 2 + (r + step) % 3;
    for (int i = 0; i < n; ++i, ++next) {
      if (r == rank) out.push_back(next % data.num_train());
    }
  }
  return out;
}

std::vector<int64_t> GlobalSamples(const engine::MovieLensCtr& data, int step, int world) {
  std::vector<int64_t> all;
  for (int r = 0; r < world; ++r) {
    std::vector<int64_t> part = Samples(data, step, r);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

struct Reference {
  std::vector<float> dense;
  std::vector<std::vector<float>> tables;
};

// One rank holding everything, on the concatenated batches of steps
// [0, steps).
Reference TrainOneRank(const engine::MovieLensCtr& data, int steps, const engine::GemLiteConfig& config = Config(),
                       int world = kWorld) {
  auto model = engine::GemLite<float>::Create(config, data.schema());
  EXPECT_TRUE(model.ok());
  for (int step = 0; step < steps; ++step) {
    EXPECT_TRUE((*model)->ForwardBackward(data.MakeBatch(false, GlobalSamples(data, step, world))).ok());
    EXPECT_TRUE((*model)->ApplyUpdates().ok());
  }
  Reference r;
  r.dense = engine::FlatDenseParameters(**model);
  for (int t = 0; t < (*model)->num_tables(); ++t) {
    const TensorView v = (*model)->Table(t);
    r.tables.emplace_back(v.as<float>(), v.as<float>() + v.numel());
  }
  return r;
}

// Every rank's dense parameters and table rows against the reference.
void ExpectMatches(DistributedModel& m, const Reference& ref, int rank) {
  ASSERT_TRUE(m.GatherDense().ok());
  const std::vector<float> dense = engine::FlatDenseParameters(m.engine_model());
  ASSERT_EQ(dense.size(), ref.dense.size());
  const double dense_error = engine::MaxRelativeError(dense.data(), ref.dense.data(), dense.size());
  EXPECT_LT(dense_error, 1e-5) << "rank " << rank << " dense";
  if (rank == 0) std::printf("rank 0: dense parameters' max relative error %.2e\n", dense_error);
  const dist::EmbeddingShardingPlan& plan = m.tables().plan();
  auto& tables = const_cast<dist::ShardedEmbeddingCollection&>(m.tables());
  const int table_rank = tables.group_rank();
  for (int t : plan.TablesOn(table_rank)) {
    const auto [first, end] = tables.StoredRows(t);
    const auto [c0, c1] = plan.ColumnRange(t, table_rank);
    const int64_t dim = plan.table(t).dim;
    std::vector<float> expected;
    for (int64_t row = first; row < end; ++row) {
      expected.insert(expected.end(), ref.tables[t].begin() + row * dim + c0, ref.tables[t].begin() + row * dim + c1);
    }
    EXPECT_LT(engine::MaxRelativeError(tables.shard(t).as<float>(), expected.data(), expected.size()), 1e-5)
        << "rank " << rank << " table " << t;
  }
}

// The losses of every step on kWorld ranks (the sample-weighted mean of
// the ranks' own means) against one rank's on the global batches.
std::vector<double> OneRankLosses(const engine::MovieLensCtr& data, int steps,
                                  const engine::GemLiteConfig& config = Config()) {
  auto model = engine::GemLite<float>::Create(config, data.schema());
  EXPECT_TRUE(model.ok());
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    auto r = (*model)->ForwardBackward(data.MakeBatch(false, GlobalSamples(data, step, kWorld)));
    EXPECT_TRUE(r.ok());
    losses.push_back(r->ctr_loss);
    EXPECT_TRUE((*model)->ApplyUpdates().ok());
  }
  return losses;
}

// Runs `fn(rank, groups, world)` on kWorld Gloo ranks laid out by the plan's
// groups `plan_groups`, or by `hints` without them.
void OnRanks(const dist::ParallelismHints& hints,
             const std::function<void(int, const dist::TrainingGroups&, comm::Communicator&)>& fn,
             const std::vector<dist::NamedGroup>& plan_groups = {}, int world = kWorld) {
  dist::RunOnGlooRanks(world, plan_groups, hints, fn);
}

void Train(DistributedModel& m, const engine::MovieLensCtr& data, int rank, int from, int to,
           std::vector<double>* weighted_losses = nullptr) {
  for (int step = from; step < to; ++step) {
    DistributedModel::Times times;
    const std::vector<int64_t> samples = Samples(data, step, rank);
    auto r = m.TrainStep(data.MakeBatch(false, samples), &times);
    ASSERT_TRUE(r.ok()) << r.status();
    if (weighted_losses != nullptr) {
      const double share = static_cast<double>(samples.size()) / GlobalSamples(data, step, kWorld).size();
      weighted_losses->push_back(r->ctr_loss * share);
    }
  }
}

// Under expert parallelism a rank stores its block of the experts (1/EP of
// the experts' bytes when EP divides the experts), outside its FSDP shard;
// without it, none (the experts sit in the FSDP shard).
void ExpectStoresOwnExpertsOnly(DistributedModel& m, const dist::TrainingGroups& groups) {
  const int64_t total = m.expert_parameter_bytes();
  if (!m.expert_parallel()) {
    EXPECT_EQ(m.stored_expert_parameter_bytes(), 0);
    return;
  }
  const int ep = groups.expert()->size();
  const auto [first, end] = dist::ExpertBlock(Config().num_experts, ep, groups.expert()->rank());
  EXPECT_GT(total, 0);
  EXPECT_EQ(m.stored_expert_parameter_bytes(), total / Config().num_experts * (end - first));
  if (Config().num_experts % ep == 0) {
    EXPECT_EQ(m.stored_expert_parameter_bytes() * ep, total);
  }
  // Before: every rank's FSDP shard held 1/FSDP of all dense bytes, experts
  // included, and the step gathered all of them.
  const int64_t dense_total = static_cast<int64_t>(engine::FlatDenseParameters(m.engine_model()).size() * sizeof(float));
  const int64_t fsdp = groups.fsdp()->size();
  // Each FSDP unit pads its shard to whole elements: up to one element per
  // unit above 1/FSDP of the bytes.
  const int64_t even = ((dense_total - total) / 4 + fsdp - 1) / fsdp * 4;
  EXPECT_GE(m.dense_shard_bytes(), even);
  EXPECT_LE(m.dense_shard_bytes(), even + 4 * static_cast<int64_t>(m.unit_names().size()));
  if (groups.expert()->rank() == 0 && groups.fsdp()->rank() == 0) {
    std::printf("EP %d, FSDP %lld: experts %lld B of %lld B dense; stored per rank: FSDP shard %lld B + experts %lld B "
                "(before: FSDP shard %lld B, experts in it); gathered per step %lld B (before %lld B)\n",
                ep, static_cast<long long>(fsdp), static_cast<long long>(total), static_cast<long long>(dense_total),
                static_cast<long long>(m.dense_shard_bytes()), static_cast<long long>(m.stored_expert_parameter_bytes()),
                static_cast<long long>((dense_total / 4 + fsdp - 1) / fsdp * 4),
                static_cast<long long>(dense_total - total + m.stored_expert_parameter_bytes()),
                static_cast<long long>(dense_total));
  }
}

// Trains kSteps on kWorld ranks laid out by `hints` with the tables placed
// by `planned(schema tables)`, and checks every step's global loss and the
// final parameters (dense and every rank's table block) against one rank.
void ExpectPlanTrainsLikeOneRank(const dist::ParallelismHints& hints,
                                 const std::function<std::vector<dist::PlannedTable>(
                                     const std::vector<engine::FeatureSchema::Table>&)>& planned,
                                 const std::vector<dist::NamedGroup>& plan_groups = {}) {
  const engine::MovieLensCtr data = Data();
  const Reference ref = TrainOneRank(data, kSteps);
  const std::vector<double> ref_losses = OneRankLosses(data, kSteps);
  std::vector<std::vector<double>> losses(kWorld);
  OnRanks(hints, [&](int rank, const dist::TrainingGroups& groups, comm::Communicator& world) {
    const std::vector<dist::PlannedTable> plan = planned(data.schema().tables);
    auto m = DistributedModel::Create(Config(), data.schema(), &groups, &world, plan);
    ASSERT_TRUE(m.ok()) << m.status();
    bool has_expert_groups = false;
    for (const dist::NamedGroup& g : plan_groups) has_expert_groups |= g.name.rfind("expert/", 0) == 0;
    EXPECT_EQ((*m)->expert_parallel(), has_expert_groups);
    ExpectStoresOwnExpertsOnly(**m, groups);
    // Under V3 a rank stores only its part of every block of two rows or more.
    bool v3 = false;
    for (const dist::NamedGroup& g : plan_groups) v3 |= g.name.rfind("table_shards/", 0) == 0;
    const dist::EmbeddingShardingPlan& sharding = (*m)->tables().plan();
    for (int t : sharding.TablesOn((*m)->tables().group_rank())) {
      const auto block = sharding.RowRange(t, (*m)->tables().group_rank());
      const auto stored = (*m)->tables().StoredRows(t);
      if (block.second - block.first < 2) continue;
      EXPECT_EQ(stored.second - stored.first < block.second - block.first, v3) << "table " << t;
    }
    // Shard i of every table sits on the rank the plan lists i-th.
    for (size_t t = 0; t < plan.size(); ++t) {
      for (size_t i = 0; i < plan[t].ranks.size(); ++i) {
        EXPECT_EQ((*m)->tables().plan().ShardIndex(t, plan[t].ranks[i]), static_cast<int>(i)) << "table " << t;
      }
    }
    Train(**m, data, rank, 0, kSteps, &losses[rank]);
    ExpectMatches(**m, ref, rank);
  }, plan_groups);
  for (int step = 0; step < kSteps; ++step) {
    double global = 0;
    for (int r = 0; r < kWorld; ++r) global += losses[r][step];
    EXPECT_NEAR(global, ref_losses[step], 1e-5 * std::abs(ref_losses[step])) << "step " << step;
  }
}

// Every table in 4 column slices, each table's slices on the ranks in
// another order, tables over all 4 ranks.
TEST(DistributedModelTest, PlannedColumnWiseTablesTrainLikeOneRank) {
  ExpectPlanTrainsLikeOneRank({2, 2, 4}, [](const std::vector<engine::FeatureSchema::Table>& tables) {
    std::vector<dist::PlannedTable> p;
    for (size_t t = 0; t < tables.size(); ++t) {
      std::vector<int> ranks;
      for (int i = 0; i < 4; ++i) ranks.push_back(static_cast<int>((t + 3 * i) % 4));
      p.push_back({tables[t].name, "CW", 4, ranks});
    }
    return p;
  });
}

// Row blocks over the whole group ("RW") and over two listed ranks, last
// first ("TWRW"), alternating, with the tables replicated twice (each
// shard's bags and gradients gathered across the copies).
TEST(DistributedModelTest, PlannedRowWiseTablesTrainLikeOneRank) {
  ExpectPlanTrainsLikeOneRank({2, 2, 2}, [](const std::vector<engine::FeatureSchema::Table>& tables) {
    std::vector<dist::PlannedTable> p;
    for (size_t t = 0; t < tables.size(); ++t) {
      p.push_back(t % 2 == 0 ? dist::PlannedTable{tables[t].name, "RW", 2, {}}
                             : dist::PlannedTable{tables[t].name, "TWRW", 2, {1, 0}});
    }
    return p;
  });
}

std::vector<dist::PlannedTable> RowWiseEverywhere(const std::vector<engine::FeatureSchema::Table>& tables) {
  std::vector<dist::PlannedTable> p;
  for (const engine::FeatureSchema::Table& t : tables) p.push_back({t.name, "RW", 4, {}});
  return p;
}

// The plan's expert-parallel groups: two groups of two ranks, one expert
// on each rank; every token goes to both ranks of its group and back.
const std::vector<dist::NamedGroup> kExpertGroups = {{"fsdp/0", {0, 1, 2, 3}},
                                                      {"tables/0", {0, 1, 2, 3}},
                                                      {"expert/moe/0", {0, 1}},
                                                      {"expert/moe/1", {2, 3}}};

TEST(DistributedModelTest, ExpertParallelGroupsTrainLikeOneRank) {
  ExpectPlanTrainsLikeOneRank({}, RowWiseEverywhere, kExpertGroups);
}

// One expert-parallel group over all four ranks with two experts: ranks 2
// and 3 compute none, yet send their tokens and get the outputs back;
// FSDP groups of two replicated twice around it.
TEST(DistributedModelTest, ExpertParallelGroupWiderThanTheExpertsTrainsLikeOneRank) {
  ExpectPlanTrainsLikeOneRank({}, RowWiseEverywhere,
                              {{"fsdp/0", {0, 1}},
                               {"fsdp/1", {2, 3}},
                               {"tables/0", {0, 1, 2, 3}},
                               {"expert/moe/0", {0, 1, 2, 3}}});
}

// V3: tables over {0, 2} and {1, 3}, each position's shards split again
// over {0, 1} and {2, 3} (gathered for every step); column-, row- and
// table-wise tables.
const std::vector<dist::NamedGroup> kV3Groups = {{"fsdp/0", {0, 1, 2, 3}},
                                                  {"tables/0", {0, 2}},
                                                  {"tables/1", {1, 3}},
                                                  {"table_shards/0", {0, 1}},
                                                  {"table_shards/1", {2, 3}}};

std::vector<dist::PlannedTable> MixedOverTwo(const std::vector<engine::FeatureSchema::Table>& tables) {
  std::vector<dist::PlannedTable> p;
  for (size_t t = 0; t < tables.size(); ++t) {
    p.push_back(t % 3 == 0   ? dist::PlannedTable{tables[t].name, "CW", 2, {1, 0}}
                : t % 3 == 1 ? dist::PlannedTable{tables[t].name, "RW", 2, {}}
                             : dist::PlannedTable{tables[t].name, "TW", 1, {static_cast<int>(t % 2)}});
  }
  return p;
}

TEST(DistributedModelTest, V3ShardGroupsTrainLikeOneRank) {
  ExpectPlanTrainsLikeOneRank({}, MixedOverTwo, kV3Groups);
}

// Resumes `saved` (written after kSteps / 2) on four ranks holding FSDP and
// tables over all of them, with no expert parallelism, and trains to the end
// like one rank.
void ExpectResumesOnFourRanksLikeOneRank(const engine::MovieLensCtr& data, const Reference& ref,
                                         const std::vector<CheckpointShard>& saved) {
  OnRanks({4, 1, 4}, [&](int rank, const dist::TrainingGroups& groups, comm::Communicator& world) {
    auto m = DistributedModel::Create(Config(), data.schema(), &groups, &world);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE((*m)->Restore(saved).ok());
    Train(**m, data, rank, kSteps / 2, kSteps);
    ExpectMatches(**m, ref, rank);
  });
}

// A V3 checkpoint holds every part once and resumes under a plain layout.
TEST(DistributedModelTest, V3CheckpointResumesUnderAnotherLayout) {
  const engine::MovieLensCtr data = Data();
  const Reference ref = TrainOneRank(data, kSteps);
  std::vector<CheckpointShard> saved(kWorld);
  OnRanks({}, [&](int rank, const dist::TrainingGroups& groups, comm::Communicator& world) {
    auto m = DistributedModel::Create(Config(), data.schema(), &groups, &world, MixedOverTwo(data.schema().tables));
    ASSERT_TRUE(m.ok()) << m.status();
    Train(**m, data, rank, 0, kSteps / 2);
    ASSERT_TRUE((*m)->Save(&saved[rank]).ok());
  }, kV3Groups);
  ExpectResumesOnFourRanksLikeOneRank(data, ref, saved);
}

// An expert-parallel checkpoint records every expert once (with the other
// dense parameters, every element once) and resumes under a layout without
// expert parallelism, and on one rank.
TEST(DistributedModelTest, ExpertParallelCheckpointResumesUnderAnotherLayoutAndOnOneRank) {
  const engine::MovieLensCtr data = Data();
  const Reference ref = TrainOneRank(data, kSteps);
  std::vector<CheckpointShard> saved(kWorld);
  int64_t expert_bytes = 0;
  OnRanks({}, [&](int rank, const dist::TrainingGroups& groups, comm::Communicator& world) {
    auto m = DistributedModel::Create(Config(), data.schema(), &groups, &world, RowWiseEverywhere(data.schema().tables));
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE((*m)->expert_parallel());
    if (rank == 0) expert_bytes = (*m)->expert_parameter_bytes();
    Train(**m, data, rank, 0, kSteps / 2);
    ASSERT_TRUE((*m)->Save(&saved[rank]).ok());
  }, kExpertGroups);
  int64_t recorded = 0, recorded_experts = 0;
  for (const CheckpointShard& s : saved) {
    for (int slot : DenseSlots(s)) {
      const std::string key = slot == 0 ? "dense.range" : absl::StrCat("dense.", slot, ".range");
      if (std::optional<std::pair<int64_t, int64_t>> r = RangeRecord(s, key)) {
        recorded += r->second - r->first;
        // Slot 2 holds a rank's experts.
        if (slot == 2) recorded_experts += r->second - r->first;
      }
    }
  }
  EXPECT_EQ(recorded, static_cast<int64_t>(ref.dense.size()));
  EXPECT_EQ(recorded_experts * static_cast<int64_t>(sizeof(float)), expert_bytes);
  ExpectResumesOnFourRanksLikeOneRank(data, ref, saved);
  auto single = SingleRankModel::Create(Config(), data.schema(), engine::ExecutionOptions());
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_TRUE((*single)->Restore(saved).ok());
  for (int step = kSteps / 2; step < kSteps; ++step) {
    RankModel::Times times;
    ASSERT_TRUE((*single)->TrainStep(data.MakeBatch(false, GlobalSamples(data, step, kWorld)), &times, nullptr).ok());
  }
  const std::vector<float> dense = engine::FlatDenseParameters((*single)->engine_model());
  ASSERT_EQ(dense.size(), ref.dense.size());
  EXPECT_LT(engine::MaxRelativeError(dense.data(), ref.dense.data(), dense.size()), 1e-5);
}

// Whole tables on the ranks the plan names (not the balanced rule's), plus
// one column-wise table on two of them, as a plan mixes them.
TEST(DistributedModelTest, PlannedTableWiseAndMixedTablesTrainLikeOneRank) {
  ExpectPlanTrainsLikeOneRank({4, 1, 4}, [](const std::vector<engine::FeatureSchema::Table>& tables) {
    std::vector<dist::PlannedTable> p;
    for (size_t t = 0; t < tables.size(); ++t) {
      p.push_back(t == 1 ? dist::PlannedTable{tables[t].name, "CW", 2, {3, 1}}
                         : dist::PlannedTable{tables[t].name, "TW", 1, {static_cast<int>(3 - t % 4)}});
    }
    return p;
  });
}

// The acceptance layout: FSDP 2 x replicas 2, tables sharded over 2 (and
// replicated twice), 20 steps, against one rank on the same global batches.
TEST(DistributedModelTest, FourRanksTrainLikeOne) {
  const engine::MovieLensCtr data = Data();
  const Reference ref = TrainOneRank(data, kSteps);
  OnRanks({2, 2, 2}, [&](int rank, const dist::TrainingGroups& groups, comm::Communicator& world) {
    auto m = DistributedModel::Create(Config(), data.schema(), &groups, &world);
    ASSERT_TRUE(m.ok()) << m.status();
    Train(**m, data, rank, 0, kSteps);
    ExpectMatches(**m, ref, rank);
  });
}

// Index of `entry` in `log`, or -1.
int Find(const std::vector<std::string>& log, const std::string& entry) {
  auto it = std::find(log.begin(), log.end(), entry);
  return it == log.end() ? -1 : static_cast<int>(it - log.begin());
}

// FSDP units with prefetch: unit i+1's all-gather is started before unit i
// computes its forward and waited for only when unit i+1 is needed; unit
// i's reduce-scatter is started before the units before it have finished
// their backward. The result is the synchronous path's, bit for bit (the
// same collectives on the same data), and one rank's on the global batches.
TEST(DistributedModelTest, PrefetchOverlapsTheUnitsCollectivesAndEqualsTheSynchronousPath) {
  const engine::MovieLensCtr data = Data();
  engine::GemLiteConfig config = Config();
  config.seq_layers = 2;
  const Reference ref = TrainOneRank(data, kSteps, config);
  OnRanks({2, 2, 2}, [&](int rank, const dist::TrainingGroups& groups, comm::Communicator& world) {
    auto prefetched = DistributedModel::Create(config, data.schema(), &groups, &world);
    ASSERT_TRUE(prefetched.ok()) << prefetched.status();
    auto synchronous = DistributedModel::Create(config, data.schema(), &groups, &world);
    ASSERT_TRUE(synchronous.ok()) << synchronous.status();
    ASSERT_TRUE((*prefetched)->prefetch());
    (*synchronous)->set_prefetch(false);
    const std::vector<std::string> units = (*prefetched)->unit_names();
    EXPECT_EQ(units, (std::vector<std::string>{"dense_proj", "seq0", "seq1", "cross", "dcn", "moe", "heads"}));

    std::vector<std::string> log;
    (*prefetched)->set_schedule_log(&log);
    Train(**prefetched, data, rank, 0, 1);
    (*prefetched)->set_schedule_log(nullptr);
    std::string order;
    for (const std::string& e : log) order += e + "; ";
    SCOPED_TRACE(order);
    for (size_t u = 0; u < units.size(); ++u) {
      const int start = Find(log, "gather_start " + units[u]), ready = Find(log, "gather_ready " + units[u]);
      ASSERT_GE(start, 0);
      ASSERT_GT(ready, start);
      if (u > 0) {
        // Started when unit u-1 arrived, before unit u-1 computed: its
        // first module's forward comes between the start and the wait.
        EXPECT_EQ(start, Find(log, "gather_ready " + units[u - 1]) + 1);
        EXPECT_GE(std::count_if(log.begin() + start, log.begin() + ready,
                                [](const std::string& e) { return e.rfind("forward ", 0) == 0; }),
                  1)
            << units[u];
        // Its gradients travel while the units before it run their backward.
        const int reduce = Find(log, "reduce_start " + units[u]);
        ASSERT_GE(reduce, 0);
        EXPECT_GE(std::count_if(log.begin() + reduce, log.end(),
                                [](const std::string& e) { return e.rfind("backward_done ", 0) == 0; }),
                  1)
            << units[u];
      }
    }
    EXPECT_EQ(Find(log, "reduce_start " + units[0]) + 1 < static_cast<int>(log.size()), true);

    Train(**prefetched, data, rank, 1, kSteps);
    Train(**synchronous, data, rank, 0, kSteps);
    ASSERT_TRUE((*prefetched)->GatherDense().ok());
    ASSERT_TRUE((*synchronous)->GatherDense().ok());
    EXPECT_EQ(engine::FlatDenseParameters((*prefetched)->engine_model()),
              engine::FlatDenseParameters((*synchronous)->engine_model()))
        << "rank " << rank;
    ExpectMatches(**prefetched, ref, rank);
  });
}

// Quantize before all-gather: with the recipe's FP8 all-gather, the
// weights of dcn, the experts and the first tower layers (those the FP8
// GEMMs take) travel FP8 and every rank trains on the same copy, rounded as
// the FP8 GEMMs round a weight (E4M3, 128x128 tiles), while its shard stays
// fp32; the CPU engine computes in fp32 on it. Stated tolerance against the
// fp32 gather (one rank on the global batches): each of the first 10 steps'
// loss within 4% relative (measured 2.52%), the mean loss of all 20 steps
// within 1% (0.26%), the final dense parameters (the gathered copy, itself
// rounded) within 5% of the largest. Batches of ~10 samples make the
// trajectory sensitive to any perturbation of the weights. The bytes each
// rank all-gathers drop by ~3 per FP8 element against fp32. The units' FP8
// gathers are prefetched; a twin gathering them blocking ends with the
// same parameters bit for bit.
TEST(DistributedModelTest, Fp8AllGatherTrainsLikeTheFullPrecisionGatherWithinFp8Tolerance) {
  const engine::MovieLensCtr data = Data();
  // Learning rates 10x below the defaults: at the defaults this tiny model
  // on batches of ~10 samples turns any perturbation of the weights (FP8
  // rounding moves them ~2.5%, relative L2) into a different trajectory
  // within a few steps (first step's loss +0.5%, fifth +23%), as the
  // sign-normalised AdamW and Adagrad updates flip on small gradients.
  engine::GemLiteConfig config = Config();
  config.learning_rate /= 10;
  config.adagrad_learning_rate /= 10;
  // Widths that are multiples of 16, so that the FP8 GEMMs take dcn's, the
  // experts' and the first tower layers' weights (only those travel FP8).
  config.dim = 16;
  config.expert_hidden = 16;
  config.expert_out = 16;
  config.tower_hidden = 16;
  const Reference ref = TrainOneRank(data, kSteps, config);
  const std::vector<double> ref_losses = OneRankLosses(data, kSteps, config);
  config.fp8.modules = {"dcn", "moe.experts", "towers"};
  config.fp8.fp8_all_gather = true;
  std::vector<std::vector<double>> losses(kWorld);
  std::vector<double> dense_error(kWorld), table_error(kWorld);
  OnRanks({2, 2, 2}, [&](int rank, const dist::TrainingGroups& groups, comm::Communicator& world) {
    auto m = DistributedModel::Create(config, data.schema(), &groups, &world);
    ASSERT_TRUE(m.ok()) << m.status();
    const int64_t fp8 = (*m)->fp8_gathered_numel();
    EXPECT_GT(fp8, 0);
    // The largest slot: its fp32 shard less 3 bytes per FP8 element, plus
    // the 16-byte roundings and 4 bytes per 128x128 tile all-reduced; at
    // least the group's share of the FP8 saving.
    const int64_t fp32 = (*m)->dense_shard_bytes();
    EXPECT_LT((*m)->dense_gather_bytes(), fp32 - 3 * fp8 / 2 / 2);
    if (rank == 0) {
      std::printf("dense all-gather per rank: fp32 %lld bytes, FP8 recipe %lld bytes (%lld of the group's FP8 "
                  "elements)\n",
                  static_cast<long long>(fp32), static_cast<long long>((*m)->dense_gather_bytes()),
                  static_cast<long long>(fp8));
    }
    ASSERT_TRUE((*m)->prefetch());
    Train(**m, data, rank, 0, kSteps, &losses[rank]);
    ASSERT_TRUE((*m)->GatherDense().ok());
    const std::vector<float> dense = engine::FlatDenseParameters((*m)->engine_model());
    // The FP8 units' gathers prefetched (unpacked when made ready) train
    // exactly like the blocking ones.
    auto blocking = DistributedModel::Create(config, data.schema(), &groups, &world);
    ASSERT_TRUE(blocking.ok()) << blocking.status();
    (*blocking)->set_prefetch(false);
    Train(**blocking, data, rank, 0, kSteps);
    ASSERT_TRUE((*blocking)->GatherDense().ok());
    EXPECT_EQ(engine::FlatDenseParameters((*blocking)->engine_model()), dense) << "rank " << rank;
    ASSERT_EQ(dense.size(), ref.dense.size());
    dense_error[rank] = engine::MaxRelativeError(dense.data(), ref.dense.data(), dense.size());
    auto& tables = const_cast<dist::ShardedEmbeddingCollection&>((*m)->tables());
    const dist::EmbeddingShardingPlan& plan = tables.plan();
    for (int t : plan.TablesOn(tables.group_rank())) {
      const auto [first, end] = tables.StoredRows(t);
      const auto [c0, c1] = plan.ColumnRange(t, tables.group_rank());
      const int64_t dim = plan.table(t).dim;
      std::vector<float> expected;
      for (int64_t row = first; row < end; ++row) {
        expected.insert(expected.end(), ref.tables[t].begin() + row * dim + c0, ref.tables[t].begin() + row * dim + c1);
      }
      table_error[rank] = std::max(
          table_error[rank], engine::MaxRelativeError(tables.shard(t).as<float>(), expected.data(), expected.size()));
    }
  });
  double worst_early = 0, sum = 0, ref_sum = 0;
  for (int step = 0; step < kSteps; ++step) {
    double global = 0;
    for (int r = 0; r < kWorld; ++r) global += losses[r][step];
    if (step < 10) worst_early = std::max(worst_early, std::abs(global - ref_losses[step]) / ref_losses[step]);
    sum += global;
    ref_sum += ref_losses[step];
  }
  const double mean_error = std::abs(sum - ref_sum) / ref_sum;
  std::printf("FP8 all-gather vs fp32: first 10 steps' loss within %.2e, mean loss %.2e, dense %.2e of the largest, "
              "tables %.2e\n",
              worst_early, mean_error, *std::max_element(dense_error.begin(), dense_error.end()),
              *std::max_element(table_error.begin(), table_error.end()));
  EXPECT_GT(std::abs(losses[0][0] + losses[1][0] + losses[2][0] + losses[3][0] - ref_losses[0]), 1e-4)
      << "the first step's weights did not travel rounded";
  EXPECT_LT(worst_early, 0.04);
  EXPECT_LT(mean_error, 0.01);
  for (int r = 0; r < kWorld; ++r) EXPECT_LT(dense_error[r], 0.05) << "rank " << r;
}

// A checkpoint written under one layout resumes under another, optimizer
// state included: the run still ends where one rank does.
TEST(DistributedModelTest, CheckpointResumesUnderAnotherLayout) {
  const engine::MovieLensCtr data = Data();
  const Reference ref = TrainOneRank(data, kSteps);
  std::vector<CheckpointShard> saved(kWorld);
  OnRanks({2, 2, 2}, [&](int rank, const dist::TrainingGroups& groups, comm::Communicator& world) {
    auto m = DistributedModel::Create(Config(), data.schema(), &groups, &world);
    ASSERT_TRUE(m.ok()) << m.status();
    Train(**m, data, rank, 0, kSteps / 2);
    ASSERT_TRUE((*m)->Save(&saved[rank]).ok());
  });
  OnRanks({4, 1, 4}, [&](int rank, const dist::TrainingGroups& groups, comm::Communicator& world) {
    auto m = DistributedModel::Create(Config(), data.schema(), &groups, &world);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE((*m)->Restore(saved).ok());
    EXPECT_EQ((*m)->adam_step(), kSteps / 2);
    Train(**m, data, rank, kSteps / 2, kSteps);
    ExpectMatches(**m, ref, rank);
  });
  // Records that do not cover a rank's shard are refused.
  std::vector<CheckpointShard> partial = {saved[1]};
  OnRanks({4, 1, 4}, [&](int rank, const dist::TrainingGroups& groups, comm::Communicator& world) {
    auto m = DistributedModel::Create(Config(), data.schema(), &groups, &world);
    ASSERT_TRUE(m.ok());
    if (rank == 0) {
      EXPECT_EQ((*m)->Restore(partial).code(), absl::StatusCode::kDataLoss);
    }
  });
}

// The single-process model (the GPU path's, here on the CPU) writes and
// reads the same checkpoint records: half a run on it resumes on four
// distributed ranks, a distributed checkpoint resumes on it, and both end
// where one rank does.
TEST(DistributedModelTest, SingleRankCheckpointsInterchangeWithDistributedOnes) {
  const engine::MovieLensCtr data = Data();
  const Reference ref = TrainOneRank(data, kSteps);
  auto single = SingleRankModel::Create(Config(), data.schema(), engine::ExecutionOptions());
  ASSERT_TRUE(single.ok()) << single.status();
  for (int step = 0; step < kSteps / 2; ++step) {
    RankModel::Times times;
    ASSERT_TRUE((*single)->TrainStep(data.MakeBatch(false, GlobalSamples(data, step, kWorld)), &times, nullptr).ok());
    EXPECT_GT(times.compute_seconds, 0);
  }
  std::vector<CheckpointShard> saved(1);
  ASSERT_TRUE((*single)->Save(&saved[0]).ok());
  std::vector<CheckpointShard> distributed(kWorld);
  OnRanks({2, 2, 2}, [&](int rank, const dist::TrainingGroups& groups, comm::Communicator& world) {
    auto m = DistributedModel::Create(Config(), data.schema(), &groups, &world);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE((*m)->Restore(saved).ok());
    EXPECT_EQ((*m)->adam_step(), kSteps / 2);
    Train(**m, data, rank, kSteps / 2, kSteps - 2);
    ASSERT_TRUE((*m)->Save(&distributed[rank]).ok());
  });
  auto resumed = SingleRankModel::Create(Config(), data.schema(), engine::ExecutionOptions());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_TRUE((*resumed)->Restore(distributed).ok());
  EXPECT_EQ((*resumed)->engine_model().adam_step(), kSteps - 2);
  for (int step = kSteps - 2; step < kSteps; ++step) {
    RankModel::Times times;
    ASSERT_TRUE((*resumed)->TrainStep(data.MakeBatch(false, GlobalSamples(data, step, kWorld)), &times, nullptr).ok());
  }
  engine::GemLite<float>& e = (*resumed)->engine_model();
  const std::vector<float> dense = engine::FlatDenseParameters(e);
  ASSERT_EQ(dense.size(), ref.dense.size());
  EXPECT_LT(engine::MaxRelativeError(dense.data(), ref.dense.data(), dense.size()), 1e-5);
  for (int t = 0; t < e.num_tables(); ++t) {
    EXPECT_LT(engine::MaxRelativeError(e.Table(t).as<float>(), ref.tables[t].data(), e.Table(t).numel()), 1e-5) << "table " << t;
  }
  // Another model's checkpoint is refused, not half-restored.
  engine::GemLiteConfig other = Config();
  other.expert_out = 7;
  auto wrong = SingleRankModel::Create(other, data.schema(), engine::ExecutionOptions());
  ASSERT_TRUE(wrong.ok());
  EXPECT_EQ((*wrong)->Restore(saved).code(), absl::StatusCode::kDataLoss);
}

// Global-norm clipping of the dense gradients: `world` ranks laid out by
// `hints` or `plan_groups` train like one rank with the same clip, which is
// active (the run ends far from the unclipped one's). The norm is summed
// over the FSDP shards and the expert blocks, each counted once.
void ExpectClippedTrainingLikeOneRank(int world, const dist::ParallelismHints& hints,
                                      const std::vector<dist::NamedGroup>& plan_groups = {}) {
  const engine::MovieLensCtr data = Data();
  engine::GemLiteConfig config = Config();
  config.dense_grad_clip_norm = 0.05;
  const Reference ref = TrainOneRank(data, kSteps, config, world);
  const Reference unclipped = TrainOneRank(data, kSteps, Config(), world);
  EXPECT_GT(engine::MaxRelativeError(ref.dense.data(), unclipped.dense.data(), ref.dense.size()), 1e-2)
      << "the clip never acted";
  OnRanks(hints, [&](int rank, const dist::TrainingGroups& groups, comm::Communicator& world_comm) {
    const std::vector<dist::PlannedTable> plan =
        plan_groups.empty() ? std::vector<dist::PlannedTable>() : RowWiseEverywhere(data.schema().tables);
    auto m = DistributedModel::Create(config, data.schema(), &groups, &world_comm, plan);
    ASSERT_TRUE(m.ok()) << m.status();
    for (int step = 0; step < kSteps; ++step) {
      DistributedModel::Times times;
      const std::vector<int64_t> samples = Samples(data, step, rank);
      ASSERT_TRUE((*m)->TrainStep(data.MakeBatch(false, samples), &times).ok());
    }
    ExpectMatches(**m, ref, rank);
  }, plan_groups, world);
}

TEST(DistributedModelGradClipTest, TwoFsdpRanksTrainLikeOneRank) {
  ExpectClippedTrainingLikeOneRank(2, {2, 1, 2});
}

TEST(DistributedModelGradClipTest, FsdpTimesReplicasTrainLikeOneRank) {
  ExpectClippedTrainingLikeOneRank(4, {2, 2, 2});
}

TEST(DistributedModelGradClipTest, ExpertParallelGroupsTrainLikeOneRank) {
  ExpectClippedTrainingLikeOneRank(4, {}, kExpertGroups);
}

// Replicated FSDP shards and an expert group wider than the experts (two
// ranks hold none): neither the replicas nor the empty ranks add anything.
TEST(DistributedModelGradClipTest, ReplicasAndRanksWithoutExpertsCountOnce) {
  ExpectClippedTrainingLikeOneRank(4, {},
                                   {{"fsdp/0", {0, 1}},
                                    {"fsdp/1", {2, 3}},
                                    {"tables/0", {0, 1, 2, 3}},
                                    {"expert/moe/0", {0, 1, 2, 3}}});
}

}  // namespace
}  // namespace recfleet::worker
