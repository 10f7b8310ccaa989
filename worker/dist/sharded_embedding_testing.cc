#include "worker/dist/sharded_embedding_testing.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/embedding/embedding.h"
#include "worker/comm/testing.h"
#include "worker/dist/sharded_embedding.h"

namespace recfleet {
namespace dist {
namespace {

float Init(int t, int64_t row, int64_t col) { return 0.01f * static_cast<float>((t * 31 + row * 7 + col * 3) % 23); }

}  // namespace

// One Forward + BackwardAndUpdate over G ranks (no replicas) against the
// embedding kernels on whole tables and every rank's bags concatenated.
// Tables get different bag counts per rank (none, on one rank of table 0);
// table 2 is a per-token lookup (every bag holds one id), as a sequence
// feature uses it.
void CheckAgainstWholeTables(int group, comm::TestMemory& memory, const GroupConnector& connect) {
  const std::vector<EmbeddingTableConfig> tables = {{"sum_rows", 11, 3, Pooling::kSum},
                                                    {"mean_rows", 5, 2, Pooling::kMean},
                                                    {"tokens", 9, 4, Pooling::kSum},
                                                    {"mean_cols", 7, 6, Pooling::kMean}};
  // Row blocks on every rank and on a listed subset (last rank first),
  // column slices on every rank in reverse order.
  std::vector<int> subset = {group - 1}, reversed;
  if (group > 2) subset.push_back(0);
  for (int r = group - 1; r >= 0; --r) reversed.push_back(r);
  const std::vector<TablePlacement> placements = {{TableSharding::kRowWise},
                                                  {TableSharding::kRowWise, 0, subset},
                                                  {TableSharding::kTableWise, group - 1},
                                                  {TableSharding::kColumnWise, 0, reversed}};
  const RowwiseAdagradConfig adagrad = {0.1f, 1e-8f};
  constexpr int kTables = 4;
  // bags[t][r]: rank r's bags of table t; begin[t][r]: its first global bag.
  std::vector<std::vector<int64_t>> bags(kTables, std::vector<int64_t>(group)), begin = bags;
  std::vector<int64_t> total(kTables, 0);
  for (int t = 0; t < kTables; ++t) {
    for (int r = 0; r < group; ++r) {
      // Rank 1 looks nothing up in table 0: it sends its owners no bags.
      bags[t][r] = t == 2 ? 3 * r + 1 : t == 3 ? 2 + r % 2 : (t == 0 && r == 1) ? 0 : r + 2 - t;
      begin[t][r] = total[t];
      total[t] += bags[t][r];
    }
  }
  std::mt19937 rng(group);
  std::vector<std::vector<int64_t>> values(kTables), offsets(kTables, std::vector<int64_t>{0});
  std::vector<std::vector<float>> grad_out(kTables);
  for (int t = 0; t < kTables; ++t) {
    for (int64_t i = 0; i < total[t]; ++i) {
      const int len = t == 2 ? 1 : static_cast<int>(rng() % 4);  // 0..3 with repeats.
      for (int k = 0; k < len; ++k) values[t].push_back(static_cast<int64_t>(rng() % tables[t].rows));
      offsets[t].push_back(static_cast<int64_t>(values[t].size()));
    }
    for (int64_t i = 0; i < total[t] * tables[t].dim; ++i) {
      grad_out[t].push_back(0.1f * static_cast<float>(static_cast<int>(rng() % 7) - 3));
    }
  }

  // Reference on whole tables.
  std::vector<std::vector<float>> ref(kTables), ref_mom(kTables), ref_out(kTables);
  for (int t = 0; t < kTables; ++t) {
    const int64_t dim = tables[t].dim;
    ref[t].resize(tables[t].rows * dim);
    ref_mom[t].assign(tables[t].rows, 0.0f);
    for (int64_t row = 0; row < tables[t].rows; ++row) {
      for (int64_t c = 0; c < dim; ++c) ref[t][row * dim + c] = Init(t, row, c);
    }
    JaggedView ids{MakeView(values[t].data(), DType::kInt64, {static_cast<int64_t>(values[t].size())}),
                   MakeView(offsets[t].data(), DType::kInt64, {total[t] + 1})};
    TensorView table = MakeView(ref[t].data(), DType::kFloat32, {tables[t].rows, dim});
    ref_out[t].resize(total[t] * dim);
    ASSERT_TRUE(EmbeddingBagForward(table, ids, tables[t].pooling,
                                    MakeView(ref_out[t].data(), DType::kFloat32, {total[t], dim}))
                    .ok());
    ASSERT_TRUE(EmbeddingBagBackwardAdagrad(MakeView(grad_out[t].data(), DType::kFloat32, {total[t], dim}), ids,
                                            tables[t].pooling, adagrad, table,
                                            MakeView(ref_mom[t].data(), DType::kFloat32, {tables[t].rows}))
                    .ok());
  }

  comm::InProcessKvStore store;
  auto plan = EmbeddingShardingPlan::Create(tables, placements, group);
  ASSERT_TRUE(plan.ok());
  comm::RunOnThreads(group, [&](int rank) {
    auto comm = connect(store, rank, group);
    ASSERT_TRUE(comm.ok()) << comm.status();
    auto coll = ShardedEmbeddingCollection::Create(*plan, comm->get(), nullptr, adagrad);
    ASSERT_TRUE(coll.ok()) << coll.status();
    ASSERT_TRUE((*coll)->Initialize(Init).ok());
    // Ids are host memory; outputs and gradients live in `memory`.
    std::vector<std::vector<int64_t>> lv(kTables), lo(kTables, std::vector<int64_t>{0});
    std::vector<std::vector<float>> out(kTables);
    std::vector<JaggedView> ids;
    std::vector<TensorView> outs, grads;
    std::vector<void*> owned;
    for (int t = 0; t < kTables; ++t) {
      const int64_t b0 = begin[t][rank], n = bags[t][rank], dim = tables[t].dim;
      const size_t bytes = n * dim * sizeof(float);
      lv[t].assign(values[t].begin() + offsets[t][b0], values[t].begin() + offsets[t][b0 + n]);
      for (int64_t i = b0; i < b0 + n; ++i) lo[t].push_back(offsets[t][i + 1] - offsets[t][b0]);
      out[t].resize(n * dim);
      ids.push_back({MakeView(lv[t].data(), DType::kInt64, {static_cast<int64_t>(lv[t].size())}),
                     MakeView(lo[t].data(), DType::kInt64, {n + 1})});
      owned.push_back(memory.Alloc(rank, bytes + 4));
      outs.push_back(MakeView(owned.back(), DType::kFloat32, {n, dim}, memory.device()));
      owned.push_back(memory.Alloc(rank, bytes + 4));
      memory.Upload(rank, owned.back(), grad_out[t].data() + b0 * dim, bytes);
      grads.push_back(MakeView(owned.back(), DType::kFloat32, {n, dim}, memory.device()));
    }
    absl::Status s = (*coll)->Forward(ids, outs);
    ASSERT_TRUE(s.ok()) << s;
    for (int t = 0; t < kTables; ++t) {
      memory.Download(rank, out[t].data(), outs[t].data, outs[t].nbytes());
      for (size_t i = 0; i < out[t].size(); ++i) {
        ASSERT_NEAR(out[t][i], ref_out[t][begin[t][rank] * tables[t].dim + i], 1e-6) << "table " << t << " rank " << rank;
      }
    }
    s = (*coll)->BackwardAndUpdate(grads);
    ASSERT_TRUE(s.ok()) << s;
    // A second backward without a forward is a caller error.
    EXPECT_EQ((*coll)->BackwardAndUpdate(grads).code(), absl::StatusCode::kFailedPrecondition);
    for (int t = 0; t < kTables; ++t) {
      const auto range = plan->RowRange(t, rank);
      const auto [c0, c1] = plan->ColumnRange(t, rank);
      std::vector<float> sh((*coll)->shard(t).numel()), mom((*coll)->momentum(t).numel());
      memory.Download(rank, sh.data(), (*coll)->shard(t).data, sh.size() * sizeof(float));
      memory.Download(rank, mom.data(), (*coll)->momentum(t).data, mom.size() * sizeof(float));
      for (int64_t row = range.first; row < range.second; ++row) {
        // A column slice's accumulators are the whole row's.
        EXPECT_NEAR(mom[row - range.first], ref_mom[t][row], 1e-6 * std::max(1.0f, ref_mom[t][row]))
            << "table " << t << " row " << row << " rank " << rank;
        for (int64_t c = c0; c < c1; ++c) {
          EXPECT_NEAR(sh[(row - range.first) * (c1 - c0) + c - c0], ref[t][row * tables[t].dim + c], 1e-6)
              << "table " << t << " row " << row << " col " << c << " rank " << rank;
        }
      }
    }
    // Bad inputs are rejected before any communication, naming the table.
    if (!lv[0].empty()) {
      lv[0][0] = tables[0].rows;
      s = (*coll)->Forward(ids, outs);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("sum_rows"), absl::string_view::npos) << s;
    }
    std::vector<TensorView> short_outs(outs.begin(), outs.end() - 1);
    EXPECT_EQ((*coll)->Forward(ids, short_outs).code(), absl::StatusCode::kInvalidArgument);
    for (void* p : owned) memory.Free(rank, p);
  });
}

}  // namespace dist
}  // namespace recfleet
