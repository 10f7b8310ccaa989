#include "worker/dist/equivalence_testing.h"

#include <cmath>
#include <iostream>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/embedding/embedding.h"
#include "kernels/ops/adam.h"
#include "worker/comm/testing.h"
#include "worker/dist/fsdp.h"
#include "worker/dist/sharded_embedding.h"

namespace recfleet {
namespace dist {
namespace {

constexpr int kSteps = 20;
constexpr int kDense = 8;  // Dense features per sample.

std::vector<EmbeddingTableConfig> Tables() {
  return {{"item", 50, 4, Pooling::kSum}, {"user", 37, 3, Pooling::kMean}, {"history", 101, 5, Pooling::kSum}};
}

// Two table-wise tables on the first and the last rank of the table group,
// one row-wise over all of it.
std::vector<TablePlacement> Placements(int group) {
  return {{TableSharding::kTableWise, 0}, {TableSharding::kTableWise, group - 1}, {TableSharding::kRowWise, 0}};
}

int64_t PooledDim() { return 4 + 3 + 5; }
int64_t NumParams() { return kDense + PooledDim() + 1; }  // Weights and a bias.

float InitTable(int t, int64_t row, int64_t col) {
  return 0.1f * std::sin(1.0f + 0.37f * t + 0.11f * static_cast<float>(row) + 0.53f * static_cast<float>(col));
}
float InitParam(int64_t i) { return 0.05f * std::cos(0.7f * static_cast<float>(i)); }

// One sample of the synthetic task.
struct Sample {
  float x[kDense];
  float label;
  std::vector<int64_t> ids[3];
};

// Local batch sizes 3..6, rotating with the step: uneven on purpose.
int LocalBatch(int step, int rank) { return 3 + (rank + step) % 4; }

// The global batch of `step` for `world` ranks: rank 0's samples first,
// then rank 1's, ...
std::vector<Sample> GlobalBatch(int step, int world) {
  std::mt19937 rng(1234 + step);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const std::vector<EmbeddingTableConfig> tables = Tables();
  int n = 0;
  for (int r = 0; r < world; ++r) n += LocalBatch(step, r);
  std::vector<Sample> batch(n);
  for (Sample& s : batch) {
    for (float& x : s.x) x = u(rng);
    s.label = (s.x[0] + 0.5f * s.x[1] + 0.3f * u(rng)) > 0 ? 1.0f : 0.0f;
    for (int t = 0; t < 3; ++t) {
      const int len = static_cast<int>(rng() % 5);  // 0..4, empty bags included.
      // Half the ids come from a few hot rows, so ids repeat within and
      // across ranks and replicas.
      for (int i = 0; i < len; ++i) {
        const int64_t rows = tables[t].rows;
        s.ids[t].push_back(rng() % 2 ? static_cast<int64_t>(rng() % 4) : static_cast<int64_t>(rng() % rows));
      }
    }
  }
  return batch;
}

// Per table, the jagged ids of samples [begin, end).
struct JaggedIds {
  std::vector<int64_t> values[3];
  std::vector<int64_t> offsets[3];
  std::vector<JaggedView> views;
};

void MakeJagged(const std::vector<Sample>& batch, int begin, int end, JaggedIds& out) {
  out.views.clear();
  for (int t = 0; t < 3; ++t) {
    out.values[t].clear();
    out.offsets[t] = {0};
    for (int i = begin; i < end; ++i) {
      out.values[t].insert(out.values[t].end(), batch[i].ids[t].begin(), batch[i].ids[t].end());
      out.offsets[t].push_back(static_cast<int64_t>(out.values[t].size()));
    }
  }
  for (int t = 0; t < 3; ++t) {
    out.views.push_back(JaggedView{
        MakeView(out.values[t].data(), DType::kInt64, {static_cast<int64_t>(out.values[t].size())}),
        MakeView(out.offsets[t].data(), DType::kInt64, {static_cast<int64_t>(out.offsets[t].size())})});
  }
}

// The model reads the tables' outputs side by side: [n, PooledDim], table
// t in its own column block.
std::vector<float> Concat(int n, const std::vector<std::vector<float>>& per_table) {
  const std::vector<EmbeddingTableConfig> tables = Tables();
  std::vector<float> pooled(n * PooledDim());
  for (int t = 0, col = 0; t < 3; col += tables[t].dim, ++t) {
    for (int i = 0; i < n; ++i) {
      for (int64_t c = 0; c < tables[t].dim; ++c) pooled[i * PooledDim() + col + c] = per_table[t][i * tables[t].dim + c];
    }
  }
  return pooled;
}

void Split(int n, const std::vector<float>& pooled, std::vector<std::vector<float>>& per_table) {
  const std::vector<EmbeddingTableConfig> tables = Tables();
  per_table.assign(3, {});
  for (int t = 0, col = 0; t < 3; col += tables[t].dim, ++t) {
    for (int i = 0; i < n; ++i) {
      for (int64_t c = 0; c < tables[t].dim; ++c) per_table[t].push_back(pooled[i * PooledDim() + col + c]);
    }
  }
}

// [n, dim] views of per-table buffers (sized here when `allocate`).
std::vector<TensorView> PerTableViews(int n, std::vector<std::vector<float>>& per_table, bool allocate = true) {
  const std::vector<EmbeddingTableConfig> tables = Tables();
  if (allocate) per_table.assign(3, {});
  std::vector<TensorView> views;
  for (int t = 0; t < 3; ++t) {
    if (allocate) per_table[t].resize(n * tables[t].dim);
    views.push_back(MakeView(per_table[t].data(), DType::kFloat32, {n, tables[t].dim}));
  }
  return views;
}

// The model: logit = w_dense . x + w_emb . pooled + bias; loss = mean BCE
// over the GLOBAL batch of `global_n` samples, so each rank's gradient is
// its share of the global one. Fills grad_params (NumParams, overwritten)
// and grad_pooled ([n, PooledDim]).
void ModelGradients(const float* params, const std::vector<Sample>& batch, int begin, int end,
                    const std::vector<float>& pooled, int global_n, float* grad_params,
                    std::vector<float>& grad_pooled) {
  const int64_t pd = PooledDim();
  std::fill(grad_params, grad_params + NumParams(), 0.0f);
  grad_pooled.assign((end - begin) * pd, 0.0f);
  for (int i = begin; i < end; ++i) {
    const int li = i - begin;
    double z = params[NumParams() - 1];
    for (int f = 0; f < kDense; ++f) z += params[f] * batch[i].x[f];
    for (int64_t c = 0; c < pd; ++c) z += params[kDense + c] * pooled[li * pd + c];
    const float dz = static_cast<float>((1.0 / (1.0 + std::exp(-z)) - batch[i].label) / global_n);
    for (int f = 0; f < kDense; ++f) grad_params[f] += dz * batch[i].x[f];
    for (int64_t c = 0; c < pd; ++c) {
      grad_params[kDense + c] += dz * pooled[li * pd + c];
      grad_pooled[li * pd + c] = dz * params[kDense + c];
    }
    grad_params[NumParams() - 1] += dz;
  }
}

constexpr float kSgdLr = 0.5f;
const AdamConfig kAdam = {/*lr=*/0.02, 0.9, 0.999, 1e-8, 0.0, true};
const RowwiseAdagradConfig kAdagrad = {/*learning_rate=*/0.1f, 1e-8f};

void DenseStep(DenseOptimizer opt, int step, TensorView param, const TensorView& grad, TensorView m, TensorView v) {
  if (opt == DenseOptimizer::kSgd) {
    for (int64_t i = 0; i < param.numel(); ++i) param.as<float>()[i] -= kSgdLr * grad.as<const float>()[i];
    return;
  }
  ASSERT_TRUE(AdamStep(kAdam, step + 1, param, grad, m, v).ok());
}

TensorView View1(std::vector<float>& v) { return MakeView(v.data(), DType::kFloat32, {static_cast<int64_t>(v.size())}); }

struct Result {
  std::vector<float> params;
  std::vector<std::vector<float>> tables;
  std::vector<std::vector<float>> pooled_per_step;  // Global [N, PooledDim].
};

Result TrainSingleRank(DenseOptimizer opt, int world) {
  const std::vector<EmbeddingTableConfig> tables = Tables();
  Result r;
  r.params.resize(NumParams());
  for (int64_t i = 0; i < NumParams(); ++i) r.params[i] = InitParam(i);
  std::vector<float> m(NumParams(), 0.0f), v(NumParams(), 0.0f), grad(NumParams());
  std::vector<std::vector<float>> momentum(3);
  for (int t = 0; t < 3; ++t) {
    r.tables.emplace_back(tables[t].rows * tables[t].dim);
    momentum[t].assign(tables[t].rows, 0.0f);
    for (int64_t row = 0; row < tables[t].rows; ++row) {
      for (int64_t c = 0; c < tables[t].dim; ++c) r.tables[t][row * tables[t].dim + c] = InitTable(t, row, c);
    }
  }
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<Sample> batch = GlobalBatch(step, world);
    const int n = static_cast<int>(batch.size());
    JaggedIds ids;
    MakeJagged(batch, 0, n, ids);
    std::vector<std::vector<float>> out;
    const std::vector<TensorView> out_views = PerTableViews(n, out);
    for (int t = 0; t < 3; ++t) {
      TensorView table = MakeView(r.tables[t].data(), DType::kFloat32, {tables[t].rows, tables[t].dim});
      EXPECT_TRUE(EmbeddingBagForward(table, ids.views[t], tables[t].pooling, out_views[t]).ok());
    }
    const std::vector<float> pooled = Concat(n, out);
    r.pooled_per_step.push_back(pooled);
    std::vector<float> grad_pooled;
    ModelGradients(r.params.data(), batch, 0, n, pooled, n, grad.data(), grad_pooled);
    std::vector<std::vector<float>> g;
    Split(n, grad_pooled, g);
    const std::vector<TensorView> g_views = PerTableViews(n, g, /*allocate=*/false);
    for (int t = 0; t < 3; ++t) {
      TensorView table = MakeView(r.tables[t].data(), DType::kFloat32, {tables[t].rows, tables[t].dim});
      EXPECT_TRUE(
          EmbeddingBagBackwardAdagrad(g_views[t], ids.views[t], tables[t].pooling, kAdagrad, table, View1(momentum[t]))
              .ok());
    }
    DenseStep(opt, step, View1(r.params), View1(grad), View1(m), View1(v));
  }
  return r;
}

double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    norm += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(diff / norm);
}

// Host mirror of a float buffer in a rank's test memory.
struct Mirrored {
  Mirrored(comm::TestMemory& memory, int rank, int64_t n)
      : memory(memory), rank(rank), host(n, 0.0f), device(memory.Alloc(rank, n * sizeof(float) + 4)) {}
  ~Mirrored() { memory.Free(rank, device); }
  void Upload() { memory.Upload(rank, device, host.data(), host.size() * sizeof(float)); }
  void Download() { memory.Download(rank, host.data(), device, host.size() * sizeof(float)); }
  TensorView view(Shape shape) const { return MakeView(device, DType::kFloat32, std::move(shape), memory.device()); }
  TensorView view() const { return view({static_cast<int64_t>(host.size())}); }

  comm::TestMemory& memory;
  int rank;
  std::vector<float> host;
  void* device;
};

}  // namespace

void CheckDistributedEquivalence(int world, int fsdp_size, DenseOptimizer opt, comm::TestMemory& memory,
                                 const std::function<comm::CommFactory(int rank)>& factory_for_rank) {
  const Result want = TrainSingleRank(opt, world);
  const std::vector<EmbeddingTableConfig> tables = Tables();
  const int64_t pd = PooledDim();
  const int replicas = world / fsdp_size;

  auto mesh = comm::DeviceMesh::Create(world, {{"replica", replicas}, {"fsdp", fsdp_size}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  comm::InProcessKvStore store;

  std::vector<std::vector<float>> final_params(world);
  std::vector<std::vector<std::vector<float>>> final_shards(world);
  comm::RunOnThreads(world, [&](int rank) {
    auto groups = comm::ProcessGroups::Build(*mesh, rank, {{"fsdp"}, {"replica"}}, store, factory_for_rank(rank));
    ASSERT_TRUE(groups.ok()) << groups.status();
    comm::Communicator* fsdp_group = groups->Get("fsdp");
    comm::Communicator* replica_group = groups->Get("replica");

    // Dense: FSDP over the flat parameter; the optimizer steps the shard on
    // the host (the kernels' CPU Adam), mirrored to the rank's memory.
    auto fsdp = FsdpFlatParameter::Create(NumParams(), fsdp_group, replica_group);
    ASSERT_TRUE(fsdp.ok()) << fsdp.status();
    const FlatShardLayout layout = fsdp->layout();
    Mirrored shard(memory, rank, layout.shard_numel), shard_grad(memory, rank, layout.shard_numel);
    Mirrored full(memory, rank, layout.padded_numel), full_grad(memory, rank, layout.padded_numel);
    std::vector<float> m(layout.shard_numel, 0.0f), v(layout.shard_numel, 0.0f);
    for (int64_t i = 0; i < layout.shard_numel; ++i) {
      const int64_t global = layout.ShardOffset(fsdp_group->rank()) + i;
      if (global < NumParams()) shard.host[i] = InitParam(global);
    }
    shard.Upload();

    auto plan = EmbeddingShardingPlan::Create(Tables(), Placements(fsdp_size), fsdp_size);
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto embeddings = ShardedEmbeddingCollection::Create(*plan, fsdp_group, replica_group, kAdagrad);
    ASSERT_TRUE(embeddings.ok()) << embeddings.status();
    ASSERT_TRUE((*embeddings)->Initialize(InitTable).ok());

    for (int step = 0; step < kSteps; ++step) {
      const std::vector<Sample> batch = GlobalBatch(step, world);
      int begin = 0;
      for (int r = 0; r < rank; ++r) begin += LocalBatch(step, r);
      const int n = LocalBatch(step, rank);
      JaggedIds ids;
      MakeJagged(batch, begin, begin + n, ids);

      absl::Status s = fsdp->AllGather(shard.view(), full.view());
      ASSERT_TRUE(s.ok()) << s;
      full.Download();
      std::vector<std::unique_ptr<Mirrored>> out, grad;
      std::vector<TensorView> out_views, grad_views;
      for (int t = 0; t < 3; ++t) {
        out.push_back(std::make_unique<Mirrored>(memory, rank, n * tables[t].dim));
        grad.push_back(std::make_unique<Mirrored>(memory, rank, n * tables[t].dim));
        out_views.push_back(out[t]->view({n, tables[t].dim}));
        grad_views.push_back(grad[t]->view({n, tables[t].dim}));
      }
      s = (*embeddings)->Forward(ids.views, out_views);
      ASSERT_TRUE(s.ok()) << s;
      std::vector<std::vector<float>> per_table;
      for (int t = 0; t < 3; ++t) {
        out[t]->Download();
        per_table.push_back(out[t]->host);
      }
      const std::vector<float> pooled = Concat(n, per_table);
      for (int64_t i = 0; i < n * pd; ++i) {
        ASSERT_NEAR(pooled[i], want.pooled_per_step[step][begin * pd + i], 1e-5)
            << "pooled differs: rank " << rank << " step " << step << " element " << i;
      }
      std::vector<float> grad_pooled;
      ModelGradients(full.host.data(), batch, begin, begin + n, pooled, static_cast<int>(batch.size()),
                     full_grad.host.data(), grad_pooled);
      std::vector<std::vector<float>> grad_per_table;
      Split(n, grad_pooled, grad_per_table);
      for (int t = 0; t < 3; ++t) {
        grad[t]->host = grad_per_table[t];
        grad[t]->Upload();
      }
      s = (*embeddings)->BackwardAndUpdate(grad_views);
      ASSERT_TRUE(s.ok()) << s;
      full_grad.Upload();
      s = fsdp->ReduceGradients(full_grad.view(), shard_grad.view(), GradReduction::kSum);
      ASSERT_TRUE(s.ok()) << s;
      shard_grad.Download();
      DenseStep(opt, step, View1(shard.host), View1(shard_grad.host), View1(m), View1(v));
      shard.Upload();
    }
    ASSERT_TRUE(fsdp->AllGather(shard.view(), full.view()).ok());
    full.Download();
    final_params[rank].assign(full.host.begin(), full.host.begin() + NumParams());
    for (int t = 0; t < 3; ++t) {
      const TensorView sh = (*embeddings)->shard(t);
      final_shards[rank].emplace_back(sh.numel());
      memory.Download(rank, final_shards[rank].back().data(), sh.data, sh.nbytes());
    }
  });
  if (::testing::Test::HasFatalFailure()) return;

  for (int rank = 0; rank < world; ++rank) {
    const double err = RelativeError(final_params[rank], want.params);
    EXPECT_LT(err, 1e-5) << "dense parameters on rank " << rank;
    std::cout << "rank " << rank << " dense relative error " << err << "\n";
  }
  // Replicas hold bit-identical shards: rank r and rank q * fsdp_size + r are
  // the same table-group rank in replicas 0 and q.
  for (int q = 1; q < replicas; ++q) {
    for (int r = 0; r < fsdp_size; ++r) {
      EXPECT_EQ(final_shards[r], final_shards[q * fsdp_size + r]) << "replica " << q << " shard " << r << " differs";
    }
  }
  // Reassemble each table from the table-group ranks of replica 0.
  auto p = EmbeddingShardingPlan::Create(Tables(), Placements(fsdp_size), fsdp_size);
  for (int t = 0; t < 3; ++t) {
    std::vector<float> table(tables[t].rows * tables[t].dim);
    for (int r = 0; r < fsdp_size; ++r) {
      const int64_t first = p->RowRange(t, r).first;
      std::copy(final_shards[r][t].begin(), final_shards[r][t].end(), table.begin() + first * tables[t].dim);
    }
    const double err = RelativeError(table, want.tables[t]);
    EXPECT_LT(err, 1e-5) << "table " << tables[t].name;
    std::cout << "table " << tables[t].name << " relative error " << err << "\n";
    // Training moved the table: the comparison is not of two initial states.
    std::vector<float> init(table.size());
    for (int64_t row = 0; row < tables[t].rows; ++row) {
      for (int64_t c = 0; c < tables[t].dim; ++c) init[row * tables[t].dim + c] = InitTable(t, row, c);
    }
    EXPECT_GT(RelativeError(want.tables[t], init), 1e-2) << "table " << tables[t].name << " barely trained";
  }
  std::vector<float> init_params(NumParams());
  for (int64_t i = 0; i < NumParams(); ++i) init_params[i] = InitParam(i);
  EXPECT_GT(RelativeError(want.params, init_params), 1e-2) << "dense parameters barely trained";
}

}  // namespace dist
}  // namespace recfleet
