#include "worker/dist/sharded_embedding.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/testing.h"

namespace recfleet {
namespace dist {
namespace {

TEST(EmbeddingShardingPlanTest, RowRangesCoverEveryRowOnce) {
  auto plan = EmbeddingShardingPlan::Create(
      {{"a", 10, 2}, {"b", 2, 3}, {"c", 7, 1}},
      {{TableSharding::kRowWise}, {TableSharding::kRowWise}, {TableSharding::kTableWise, 2}}, 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->pooled_dim(), 6);
  EXPECT_EQ(plan->pooled_offset(2), 5);
  EXPECT_EQ(plan->RowRange(0, 0), std::make_pair(int64_t{0}, int64_t{4}));
  EXPECT_EQ(plan->RowRange(0, 2), std::make_pair(int64_t{8}, int64_t{10}));
  // 2 rows over 3 ranks: rank 2 holds none and is not listed as holding b.
  EXPECT_EQ(plan->RowRange(1, 2).first, plan->RowRange(1, 2).second);
  EXPECT_EQ(plan->TablesOn(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(plan->TablesOn(2), (std::vector<int>{0, 2}));
  for (int t = 0; t < plan->num_tables(); ++t) {
    int64_t next = 0;
    for (int r = 0; r < 3; ++r) {
      const auto range = plan->RowRange(t, r);
      if (range.first == range.second) continue;
      EXPECT_EQ(range.first, next);
      next = range.second;
    }
    EXPECT_EQ(next, plan->table(t).rows);
  }
}

TEST(EmbeddingShardingPlanTest, RejectsBadPlans) {
  EXPECT_FALSE(EmbeddingShardingPlan::Create({{"a", 10, 2}}, {}, 2).ok());
  EXPECT_FALSE(EmbeddingShardingPlan::Create({{"a", 0, 2}}, {{}}, 2).ok());
  EXPECT_FALSE(EmbeddingShardingPlan::Create({{"a", 10, 2}}, {{TableSharding::kTableWise, 2}}, 2).ok());
}

float Init(int t, int64_t row, int64_t col) { return 0.01f * static_cast<float>((t * 31 + row * 7 + col * 3) % 23); }

// One Forward + BackwardAndUpdate over G ranks (no replicas) against the
// embedding kernels on whole tables and the concatenated batch.
void CheckAgainstWholeTables(int group) {
  const std::vector<EmbeddingTableConfig> tables = {{"sum_rows", 11, 3, Pooling::kSum},
                                                    {"mean_rows", 5, 2, Pooling::kMean},
                                                    {"whole", 9, 4, Pooling::kMean}};
  const std::vector<TablePlacement> placements = {
      {TableSharding::kRowWise}, {TableSharding::kRowWise}, {TableSharding::kTableWise, group - 1}};
  const RowwiseAdagradConfig adagrad = {0.1f, 1e-8f};
  const int64_t pd = 9;
  // Rank r has r + 2 samples; bag lengths 0..3 with repeats.
  std::vector<int> batch(group);
  int total = 0;
  for (int r = 0; r < group; ++r) total += (batch[r] = r + 2);
  std::mt19937 rng(group);
  std::vector<std::vector<int64_t>> values(3), offsets(3, std::vector<int64_t>{0});
  for (int t = 0; t < 3; ++t) {
    for (int i = 0; i < total; ++i) {
      const int len = static_cast<int>(rng() % 4);
      for (int k = 0; k < len; ++k) values[t].push_back(static_cast<int64_t>(rng() % tables[t].rows));
      offsets[t].push_back(static_cast<int64_t>(values[t].size()));
    }
  }
  std::vector<float> grad_out(total * pd);
  for (size_t i = 0; i < grad_out.size(); ++i) grad_out[i] = 0.1f * static_cast<float>(static_cast<int>(i % 7) - 3);

  // Reference on whole tables.
  std::vector<std::vector<float>> ref(3), ref_mom(3);
  std::vector<float> ref_pooled(total * pd);
  for (int t = 0, col = 0; t < 3; col += tables[t].dim, ++t) {
    const int64_t dim = tables[t].dim;
    ref[t].resize(tables[t].rows * dim);
    ref_mom[t].assign(tables[t].rows, 0.0f);
    for (int64_t row = 0; row < tables[t].rows; ++row) {
      for (int64_t c = 0; c < dim; ++c) ref[t][row * dim + c] = Init(t, row, c);
    }
    JaggedView ids{MakeView(values[t].data(), DType::kInt64, {static_cast<int64_t>(values[t].size())}),
                   MakeView(offsets[t].data(), DType::kInt64, {total + 1})};
    TensorView table = MakeView(ref[t].data(), DType::kFloat32, {tables[t].rows, dim});
    std::vector<float> out(total * dim), g(total * dim);
    ASSERT_TRUE(EmbeddingBagForward(table, ids, tables[t].pooling, MakeView(out.data(), DType::kFloat32, {total, dim})).ok());
    for (int i = 0; i < total; ++i) {
      for (int64_t c = 0; c < dim; ++c) {
        ref_pooled[i * pd + col + c] = out[i * dim + c];
        g[i * dim + c] = grad_out[i * pd + col + c];
      }
    }
    ASSERT_TRUE(EmbeddingBagBackwardAdagrad(MakeView(g.data(), DType::kFloat32, {total, dim}), ids,
                                            tables[t].pooling, adagrad, table,
                                            MakeView(ref_mom[t].data(), DType::kFloat32, {tables[t].rows}))
                    .ok());
  }

  comm::InProcessKvStore store;
  comm::CommOptions options;
  options.timeout = absl::Seconds(20);
  auto comms = comm::ConnectGlooGroup(store, group, options);
  ASSERT_TRUE(comms.ok()) << comms.status();
  auto plan = EmbeddingShardingPlan::Create(tables, placements, group);
  ASSERT_TRUE(plan.ok());
  comm::RunOnThreads(group, [&](int rank) {
    auto coll = ShardedEmbeddingCollection::Create(*plan, (*comms)[rank].get(), nullptr, adagrad);
    ASSERT_TRUE(coll.ok()) << coll.status();
    (*coll)->Initialize(Init);
    int begin = 0;
    for (int r = 0; r < rank; ++r) begin += batch[r];
    const int n = batch[rank];
    std::vector<std::vector<int64_t>> lv(3), lo(3, std::vector<int64_t>{0});
    std::vector<JaggedView> ids;
    for (int t = 0; t < 3; ++t) {
      lv[t].assign(values[t].begin() + offsets[t][begin], values[t].begin() + offsets[t][begin + n]);
      for (int i = begin; i < begin + n; ++i) lo[t].push_back(offsets[t][i + 1] - offsets[t][begin]);
    }
    for (int t = 0; t < 3; ++t) {
      ids.push_back({MakeView(lv[t].data(), DType::kInt64, {static_cast<int64_t>(lv[t].size())}),
                     MakeView(lo[t].data(), DType::kInt64, {n + 1})});
    }
    std::vector<float> pooled(n * pd);
    ASSERT_TRUE((*coll)->Forward(ids, MakeView(pooled.data(), DType::kFloat32, {n, pd})).ok());
    for (int64_t i = 0; i < n * pd; ++i) ASSERT_NEAR(pooled[i], ref_pooled[begin * pd + i], 1e-6) << "rank " << rank;
    ASSERT_TRUE((*coll)->BackwardAndUpdate(MakeView(grad_out.data() + begin * pd, DType::kFloat32, {n, pd})).ok());
    // A second backward without a forward is a caller error.
    EXPECT_EQ((*coll)->BackwardAndUpdate(MakeView(grad_out.data() + begin * pd, DType::kFloat32, {n, pd})).code(),
              absl::StatusCode::kFailedPrecondition);
    for (int t = 0; t < 3; ++t) {
      const auto range = plan->RowRange(t, rank);
      const TensorView sh = (*coll)->shard(t);
      const TensorView mom = (*coll)->momentum(t);
      for (int64_t row = range.first; row < range.second; ++row) {
        EXPECT_NEAR(mom.as<float>()[row - range.first], ref_mom[t][row], 1e-7);
        for (int64_t c = 0; c < tables[t].dim; ++c) {
          EXPECT_NEAR(sh.as<float>()[(row - range.first) * tables[t].dim + c], ref[t][row * tables[t].dim + c], 1e-6)
              << "table " << t << " row " << row << " rank " << rank;
        }
      }
    }
    // Out-of-range ids are rejected with the table and position.
    if (!lv[0].empty()) {
      lv[0][0] = tables[0].rows;
      absl::Status s = (*coll)->Forward(ids, MakeView(pooled.data(), DType::kFloat32, {n, pd}));
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("sum_rows"), absl::string_view::npos) << s;
    }
  });
}

TEST(ShardedEmbeddingCollectionTest, OneRankMatchesWholeTables) { CheckAgainstWholeTables(1); }
TEST(ShardedEmbeddingCollectionTest, TwoRanksMatchWholeTables) { CheckAgainstWholeTables(2); }
TEST(ShardedEmbeddingCollectionTest, ThreeRanksMatchWholeTables) { CheckAgainstWholeTables(3); }

}  // namespace
}  // namespace dist
}  // namespace recfleet
