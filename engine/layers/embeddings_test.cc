#include "engine/layers/embeddings.h"

#include <vector>

#include "engine/layers/test_util.h"
#include "gtest/gtest.h"
#include "kernels/embedding/embedding.h"

namespace recfleet::engine::layers {
namespace {

constexpr int64_t kDim = 3;

// Tables t0 (5 rows) and t1 (4 rows); f0 sums t0 rows, f1 averages t1 rows;
// an event is an item (t0) plus a tag (t1).
FeatureSchema Schema() {
  FeatureSchema s;
  s.tables = {{"t0", 5}, {"t1", 4}};
  s.id_lists = {{"f0", 0, Pooling::kSum}, {"f1", 1, Pooling::kMean}};
  s.sequence_fields = {{"item", 0}, {"tag", 1}};
  return s;
}

IdList List(const std::vector<std::vector<int64_t>>& samples) {
  IdList l;
  for (const auto& s : samples) l.Append(s);
  return l;
}

Batch TwoSamples() {
  Batch b;
  b.size = 2;
  b.id_lists = {List({{1, 2}, {}}), List({{0}, {1, 3}})};
  b.sequence = {List({{4, 0}, {1}}), List({{2, 2}, {3}})};
  return b;
}

double Row(const TensorView& table, int64_t r, int64_t c) { return table.as<double>()[r * kDim + c]; }

// The CUDA step's gradient reduction: distinct ids in first-use order, and
// every use pointing at its id's slot.
TEST(DeduplicateTest, FirstUseOrderAndSlots) {
  const std::vector<int64_t> uses = {7, 3, 7, 7, 0, 3, 9};
  const DeduplicatedIds d = Deduplicate(uses);
  EXPECT_EQ(d.unique, (std::vector<int64_t>{7, 3, 0, 9}));
  EXPECT_EQ(d.slots, (std::vector<int64_t>{0, 1, 0, 0, 2, 1, 3}));
  for (size_t i = 0; i < uses.size(); ++i) EXPECT_EQ(d.unique[d.slots[i]], uses[i]);
  const DeduplicatedIds none = Deduplicate({});
  EXPECT_TRUE(none.unique.empty());
  EXPECT_TRUE(none.slots.empty());
}

// Large tables go to threads of their own, small ones stay inline: every
// table's result, in table order, equals Deduplicate's.
TEST(DeduplicateTest, TablesInParallelEqualOneByOne) {
  std::vector<std::vector<int64_t>> uses(4);
  for (int64_t i = 0; i < 50000; ++i) uses[0].push_back((i * 7919) % 12345);
  uses[1] = {5, 5, 1};
  for (int64_t i = 0; i < 20000; ++i) uses[3].push_back(i % 16);
  const std::vector<DeduplicatedIds> all = DeduplicateTables(uses);
  ASSERT_EQ(all.size(), uses.size());
  for (size_t t = 0; t < uses.size(); ++t) {
    const DeduplicatedIds one = Deduplicate(uses[t]);
    EXPECT_EQ(all[t].unique, one.unique) << t;
    EXPECT_EQ(all[t].slots, one.slots) << t;
  }
  EXPECT_EQ(all[0].unique.size(), 12345u);
  EXPECT_EQ(all[3].unique.size(), 16u);
}

// Per table: its id-list features' ids, then its sequence fields' ids; a
// reused buffer is overwritten, not appended to.
TEST(TableUsesTest, IdListsThenSequenceFieldsPerTableIntoAReusedBuffer) {
  std::vector<std::vector<int64_t>> uses = {{9, 9, 9}, {9}, {9}};
  TableUses(Schema(), TwoSamples(), &uses);
  ASSERT_EQ(uses.size(), 2u);
  EXPECT_EQ(uses[0], (std::vector<int64_t>{1, 2, 4, 0, 1}));
  EXPECT_EQ(uses[1], (std::vector<int64_t>{0, 1, 3, 2, 2, 3}));
}

// The row count only picks how ids are indexed (an array when the table has
// no more rows than uses, a hash map otherwise): the result is the same,
// also when an id lies outside [0, rows).
TEST(DeduplicateTest, RowCountDoesNotChangeTheResult) {
  std::vector<std::vector<int64_t>> uses(3);
  for (int64_t i = 0; i < 20000; ++i) uses[0].push_back((i * 31) % 16);      // rows 16
  for (int64_t i = 0; i < 300; ++i) uses[1].push_back((i * 7919) % 100000);  // rows 1e5
  uses[2] = {3, 1, 3, 17, 1, 2};  // rows 4, but an id of 17
  const std::vector<int64_t> rows = {16, 100000, 4};
  const std::vector<DeduplicatedIds> bounded = DeduplicateTables(uses, rows);
  for (size_t t = 0; t < uses.size(); ++t) {
    const DeduplicatedIds plain = Deduplicate(uses[t]);
    EXPECT_EQ(bounded[t].unique, plain.unique) << t;
    EXPECT_EQ(bounded[t].slots, plain.slots) << t;
    EXPECT_EQ(Deduplicate(uses[t], rows[t]).slots, plain.slots) << t;
  }
  EXPECT_EQ(bounded[0].unique.size(), 16u);
  EXPECT_EQ(bounded[2].unique, (std::vector<int64_t>{3, 1, 17, 2}));
}

TEST(SparseEmbeddingsTest, ForwardPoolsAndSumsByHand) {
  ParameterRegistry registry(DType::kFloat64, 1);
  SparseEmbeddings e(Fp64Context(&registry), Schema(), kDim, TableStorage::kInternal, 7, 0.5);
  ASSERT_EQ(e.num_tables(), 2);
  EXPECT_EQ(e.num_parameters(), (5 + 4) * kDim);
  EXPECT_EQ(Row(e.table(1), 2, 1), InitialTableValue(7, 0.5, 1, 2, 1));
  std::vector<Tensor> features;
  Tensor history;
  const Batch batch = TwoSamples();
  StagedBatch staged;
  ASSERT_TRUE(staged.Stage(batch, Device::kCpu).ok());
  ASSERT_TRUE(e.Forward(staged, {}, &features, &history).ok());
  ASSERT_EQ(features.size(), 2u);
  const TensorView t0 = e.table(0), t1 = e.table(1);
  for (int64_t c = 0; c < kDim; ++c) {
    EXPECT_DOUBLE_EQ(features[0].data<double>()[c], Row(t0, 1, c) + Row(t0, 2, c));
    EXPECT_EQ(features[0].data<double>()[kDim + c], 0);  // Empty bag.
    EXPECT_DOUBLE_EQ(features[1].data<double>()[kDim + c], (Row(t1, 1, c) + Row(t1, 3, c)) / 2);
    EXPECT_DOUBLE_EQ(history.data<double>()[c], Row(t0, 4, c) + Row(t1, 2, c));
    EXPECT_DOUBLE_EQ(history.data<double>()[2 * kDim + c], Row(t0, 1, c) + Row(t1, 3, c));
  }
}

TEST(SparseEmbeddingsTest, LargeTablesFillInParallelWithTheSameValues) {
  // 4 Mi elements: filled by several threads (one per 1 Mi elements, up to
  // the cores), every element still InitialTableValue's.
  FeatureSchema schema = Schema();
  schema.tables[0].rows = 8192;
  const int64_t dim = 512;
  ParameterRegistry registry(DType::kFloat64, 1);
  SparseEmbeddings e(Fp64Context(&registry), schema, dim, TableStorage::kInternal, 3, 0.1);
  const TensorView t = e.table(0);
  for (int64_t r : {int64_t{0}, int64_t{2047}, int64_t{2048}, int64_t{4095}, int64_t{4096}, int64_t{8191}}) {
    for (int64_t c : {int64_t{0}, int64_t{255}, dim - 1}) {
      EXPECT_EQ(t.as<double>()[r * dim + c], InitialTableValue(3, 0.1, 0, r, c)) << r << "," << c;
    }
  }
}

TEST(SparseEmbeddingsTest, TableGradientsMatchFiniteDifferences) {
  ParameterRegistry registry(DType::kFloat64, 1);
  SparseEmbeddings e(Fp64Context(&registry), Schema(), kDim, TableStorage::kInternal, 7, 0.5);
  const Batch batch = TwoSamples();
  StagedBatch staged;
  ASSERT_TRUE(staged.Stage(batch, Device::kCpu).ok());
  Tensor w0 = RandomTensor({2, kDim}, 1), w1 = RandomTensor({2, kDim}, 2);
  Tensor wh = RandomTensor({3, kDim}, 3);
  std::vector<Tensor> features;
  Tensor history;
  auto loss = [&] {
    EXPECT_TRUE(e.Forward(staged, {}, &features, &history).ok());
    return Dot(features[0].view(), w0.view()) + Dot(features[1].view(), w1.view()) +
           Dot(history.view(), wh.view());
  };
  loss();
  ASSERT_TRUE(e.Backward(staged, {w0.view(), w1.view()}, wh.view()).ok());
  for (int t = 0; t < 2; ++t) {
    absl::StatusOr<Tensor> g = e.DenseTableGradient(t);
    ASSERT_TRUE(g.ok()) << g.status();
    ExpectGradient(loss, e.table(t), g->view(), "table " + std::to_string(t));
  }

  // Half of the gradient plus half of an identical replica's is the gradient.
  ParameterRegistry other_registry(DType::kFloat64, 1);
  SparseEmbeddings replica(Fp64Context(&other_registry), Schema(), kDim, TableStorage::kInternal,
                           7, 0.5);
  ASSERT_TRUE(replica.Forward(staged, {}, &features, &history).ok());
  ASSERT_TRUE(replica.Backward(staged, {w0.view(), w1.view()}, wh.view()).ok());
  const Tensor before = *e.DenseTableGradient(0);
  ASSERT_TRUE(e.ScaleGradients(0.5).ok());
  ASSERT_TRUE(e.AddGradients(replica, 0.5).ok());
  const Tensor after = *e.DenseTableGradient(0);
  for (int64_t i = 0; i < before.numel(); ++i) {
    EXPECT_NEAR(after.data<double>()[i], before.data<double>()[i], 1e-12);
  }

  // The Adagrad step moves exactly the touched rows: t0 rows 0, 1, 2, 4.
  const std::vector<double> old = Values(e.table(0));
  ASSERT_TRUE(e.ApplyUpdates(0.1f).ok());
  for (int64_t r = 0; r < 5; ++r) {
    bool moved = false;
    for (int64_t c = 0; c < kDim; ++c) moved |= Row(e.table(0), r, c) != old[r * kDim + c];
    EXPECT_EQ(moved, r != 3) << "row " << r;
  }
}

TEST(SparseEmbeddingsTest, ExternalTablesGetPooledGradients) {
  ParameterRegistry registry(DType::kFloat64, 1);
  SparseEmbeddings e(Fp64Context(&registry), Schema(), kDim, TableStorage::kExternal, 7, 0.5);
  EXPECT_EQ(e.num_tables(), 0);
  const Batch batch = TwoSamples();
  StagedBatch staged;
  ASSERT_TRUE(staged.Stage(batch, Device::kCpu).ok());
  const std::vector<TableLookups> lookups = e.Lookups(batch);
  ASSERT_EQ(lookups.size(), 2u);
  // t0: f0's two bags, then one single-id bag per event.
  EXPECT_EQ(lookups[0].ids, (std::vector<int64_t>{1, 2, 4, 0, 1}));
  EXPECT_EQ(lookups[0].offsets, (std::vector<int64_t>{0, 2, 2, 3, 4, 5}));
  EXPECT_EQ(lookups[1].ids, (std::vector<int64_t>{0, 1, 3, 2, 2, 3}));

  // The caller's row sums, [bags, dim] per table.
  Tensor pooled0 = RandomTensor({5, kDim}, 1), pooled1 = RandomTensor({5, kDim}, 2);
  const std::vector<TensorView> pooled = {pooled0.view(), pooled1.view()};
  ASSERT_TRUE(e.CheckPooled(batch, pooled).ok());
  Tensor short_rows = RandomTensor({4, kDim}, 1);
  EXPECT_EQ(e.CheckPooled(batch, {pooled0.view(), short_rows.view()}).code(),
            absl::StatusCode::kInvalidArgument);
  Tensor w0 = RandomTensor({2, kDim}, 3), w1 = RandomTensor({2, kDim}, 4);
  Tensor wh = RandomTensor({3, kDim}, 5);
  std::vector<Tensor> features;
  Tensor history;
  auto loss = [&] {
    EXPECT_TRUE(e.Forward(staged, pooled, &features, &history).ok());
    return Dot(features[0].view(), w0.view()) + Dot(features[1].view(), w1.view()) +
           Dot(history.view(), wh.view());
  };
  loss();
  // f1 is mean-pooled: its second sample averages two rows.
  for (int64_t c = 0; c < kDim; ++c) {
    EXPECT_DOUBLE_EQ(features[1].data<double>()[kDim + c], pooled1.data<double>()[kDim + c] / 2);
  }
  ASSERT_TRUE(e.Backward(staged, {w0.view(), w1.view()}, wh.view()).ok());
  const std::vector<TensorView> grads = e.PooledGradients();
  ASSERT_EQ(grads.size(), 2u);
  ExpectGradient(loss, pooled0.view(), grads[0], "pooled[0]");
  ExpectGradient(loss, pooled1.view(), grads[1], "pooled[1]");

  ParameterRegistry internal_registry(DType::kFloat64, 1);
  SparseEmbeddings internal(Fp64Context(&internal_registry), Schema(), kDim,
                            TableStorage::kInternal, 7, 0.5);
  EXPECT_EQ(internal.CheckPooled(batch, pooled).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace recfleet::engine::layers
