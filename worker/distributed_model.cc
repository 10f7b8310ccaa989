#include "worker/distributed_model.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/ops/adam.h"
#include "worker/dist/staged.h"

namespace recfleet::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

TensorView Flat(std::vector<float>& v, int64_t n) { return MakeView(v.data(), DType::kFloat32, {n}); }

// Keeps a valid data pointer for empty buffers (views reject null storage).
template <typename V>
void Resize(V& v, size_t n) {
  v.resize(n);
  if (v.capacity() == 0) v.reserve(1);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DistributedModel>> DistributedModel::Create(const engine::GemLiteConfig& config,
                                                                           const engine::FeatureSchema& schema,
                                                                           const dist::TrainingGroups* groups,
                                                                           comm::Communicator* world,
                                                                           const std::vector<dist::PlannedTable>& planned_tables) {
  std::unique_ptr<DistributedModel> m(new DistributedModel());
  m->config_ = config;
  m->groups_ = groups;
  m->world_ = world;
  absl::StatusOr<std::unique_ptr<engine::GemLite<float>>> model =
      engine::GemLite<float>::Create(config, schema, engine::TableStorage::kExternal);
  if (!model.ok()) return model.status();
  m->model_ = *std::move(model);
  for (const std::string& name : m->model_->DenseParameterNames()) {
    m->dense_params_.push_back(m->model_->DenseParameter(name));
    m->dense_grads_.push_back(m->model_->DenseGradient(name));
    m->dense_numel_ += m->dense_params_.back().numel();
  }
  m->fingerprint_ = ModelFingerprint(*m->model_, schema, config.dim);
  comm::Communicator* replica = groups->replica()->size() > 1 ? groups->replica() : nullptr;
  absl::StatusOr<dist::FsdpFlatParameter> dense = dist::FsdpFlatParameter::Create(m->dense_numel_, groups->fsdp(), replica);
  if (!dense.ok()) return dense.status();
  m->dense_.emplace(*std::move(dense));
  const dist::FlatShardLayout& layout = m->dense_->layout();
  // Every rank built the same initial parameters (the engine seeds them
  // from the config); each keeps its shard.
  m->full_.assign(layout.padded_numel, 0.0f);
  int64_t offset = 0;
  for (const TensorView& v : m->dense_params_) {
    std::memcpy(m->full_.data() + offset, v.data, v.nbytes());
    offset += v.numel();
  }
  const int64_t first = layout.ShardOffset(groups->fsdp()->rank());
  m->shard_.assign(m->full_.begin() + first, m->full_.begin() + first + layout.shard_numel);
  m->adam_m_.assign(layout.shard_numel, 0.0f);
  m->adam_v_.assign(layout.shard_numel, 0.0f);
  Resize(m->shard_grad_, layout.shard_numel);
  m->full_grad_.assign(layout.padded_numel, 0.0f);

  std::vector<dist::EmbeddingTableConfig> tables;
  for (const engine::FeatureSchema::Table& t : schema.tables) {
    // The engine divides mean-pooled bags by their length itself.
    tables.push_back({t.name, t.rows, config.dim, Pooling::kSum});
  }
  const int table_group = groups->tables()->size();
  std::vector<dist::TablePlacement> placements;
  if (planned_tables.empty()) {
    placements = dist::BalancedTablePlacements(tables, table_group);
  } else {
    absl::StatusOr<std::vector<dist::TablePlacement>> from_plan =
        dist::PlacementsFromPlan(tables, planned_tables, table_group);
    if (!from_plan.ok()) return from_plan.status();
    placements = *std::move(from_plan);
  }
  absl::StatusOr<dist::EmbeddingShardingPlan> plan =
      dist::EmbeddingShardingPlan::Create(tables, std::move(placements), table_group);
  if (!plan.ok()) return plan.status();
  RowwiseAdagradConfig adagrad;
  adagrad.learning_rate = static_cast<float>(config.adagrad_learning_rate);
  adagrad.eps = 1e-8f;  // The engine's own tables use the same.
  comm::Communicator* table_replica = groups->table_replica()->size() > 1 ? groups->table_replica() : nullptr;
  absl::StatusOr<std::unique_ptr<dist::ShardedEmbeddingCollection>> collection = dist::ShardedEmbeddingCollection::Create(
      *std::move(plan), groups->tables(), table_replica, adagrad, groups->table_shards());
  if (!collection.ok()) return collection.status();
  // One copy of every stored part goes into checkpoints: the lowest table
  // replica storing it (without V3, replica 0; under V3 each part of the
  // shard group's split is stored by one rank per copy of the tables).
  m->records_tables_ = groups->table_replica()->rank() == 0;
  if (groups->table_shards() != nullptr && groups->table_shards()->size() > 1) {
    const int replicas = groups->table_replica()->size();
    std::vector<int64_t> part = {groups->table_shards()->rank()}, parts(replicas);
    if (absl::Status s = dist::StagedAllGather(*groups->table_replica(), part, parts); !s.ok()) return s;
    m->records_tables_ =
        std::find(parts.begin(), parts.end(), part[0]) - parts.begin() == groups->table_replica()->rank();
  }
  m->tables_ = *std::move(collection);
  if (groups->expert() != nullptr && groups->expert()->size() > 1) {
    absl::StatusOr<std::unique_ptr<dist::ExpertAllToAll>> router =
        dist::ExpertAllToAll::Create(groups->expert(), config.num_experts);
    if (!router.ok()) return router.status();
    m->router_ = *std::move(router);
  }
  const engine::GemLiteConfig init = config;
  if (absl::Status s = m->tables_->Initialize([&init](int t, int64_t row, int64_t col) {
        return static_cast<float>(engine::InitialTableValue(init, t, row, col));
      });
      !s.ok()) {
    return s;
  }
  return m;
}

std::pair<int64_t, int64_t> DistributedModel::DenseRange() const {
  const dist::FlatShardLayout& layout = dense_->layout();
  const int64_t first = layout.ShardOffset(groups_->fsdp()->rank());
  return {std::min(first, dense_numel_), std::min(first + layout.shard_numel, dense_numel_)};
}

absl::Status DistributedModel::GatherDense() {
  const dist::FlatShardLayout& layout = dense_->layout();
  if (absl::Status s = dense_->AllGather(Flat(shard_, layout.shard_numel), Flat(full_, layout.padded_numel)); !s.ok()) {
    return s;
  }
  int64_t offset = 0;
  for (const TensorView& v : dense_params_) {
    std::memcpy(v.data, full_.data() + offset, v.nbytes());
    offset += v.numel();
  }
  return absl::OkStatus();
}

absl::Status DistributedModel::Lookup(const std::vector<engine::TableLookups>* lookups) {
  const int num_tables = tables_->plan().num_tables();
  if (lookups == nullptr) {
    lookups_.assign(num_tables, engine::TableLookups{{}, {0}});
  } else {
    lookups_ = *lookups;
  }
  pooled_.resize(num_tables);
  pooled_views_.clear();
  std::vector<JaggedView> ids;
  for (int t = 0; t < num_tables; ++t) {
    engine::TableLookups& l = lookups_[t];
    const int64_t bags = static_cast<int64_t>(l.offsets.size()) - 1;
    if (l.ids.capacity() == 0) l.ids.reserve(1);
    ids.push_back({MakeView(l.ids.data(), DType::kInt64, {static_cast<int64_t>(l.ids.size())}),
                   MakeView(l.offsets.data(), DType::kInt64, {static_cast<int64_t>(l.offsets.size())})});
    Resize(pooled_[t], bags * config_.dim);
    pooled_views_.push_back(MakeView(pooled_[t].data(), DType::kFloat32, {bags, config_.dim}));
  }
  return tables_->Forward(ids, pooled_views_);
}

absl::StatusOr<engine::StepResult> DistributedModel::TrainStep(const engine::Batch& batch, Times* times) {
  Clock::time_point t = Clock::now();
  if (absl::Status s = GatherDense(); !s.ok()) return s;
  times->comm_seconds += Since(t);
  t = Clock::now();
  absl::StatusOr<std::vector<engine::TableLookups>> lookups = model_->TableLookupsOf(batch);
  if (!lookups.ok()) return lookups.status();
  times->compute_seconds += Since(t);
  t = Clock::now();
  if (absl::Status s = Lookup(&*lookups); !s.ok()) return s;
  times->comm_seconds += Since(t);
  // This rank's share of the global batch weighs its mean-loss gradients.
  t = Clock::now();
  int64_t global = batch.size;
  if (absl::Status s = world_->AllReduce(MakeView(&global, DType::kInt64, {1}), comm::ReduceOp::kSum); !s.ok()) {
    return s;
  }
  times->comm_seconds += Since(t);
  model_->set_loss_weight(static_cast<double>(batch.size) / static_cast<double>(global));
  // The expert all-to-alls run inside the step; their time counts as
  // compute here.
  t = Clock::now();
  model_->SetExpertRouter(router_.get());
  absl::StatusOr<engine::StepResult> result = model_->ForwardBackward(batch, pooled_views_);
  model_->SetExpertRouter(nullptr);
  if (!result.ok()) return result.status();
  int64_t offset = 0;
  for (const TensorView& g : dense_grads_) {
    std::memcpy(full_grad_.data() + offset, g.data, g.nbytes());
    offset += g.numel();
  }
  times->compute_seconds += Since(t);
  const dist::FlatShardLayout& layout = dense_->layout();
  t = Clock::now();
  if (absl::Status s = dense_->ReduceGradients(Flat(full_grad_, layout.padded_numel),
                                               Flat(shard_grad_, layout.shard_numel), dist::GradReduction::kSum);
      !s.ok()) {
    return s;
  }
  times->comm_seconds += Since(t);
  t = Clock::now();
  AdamConfig adam;
  adam.lr = config_.learning_rate;
  adam.weight_decay = config_.weight_decay;
  if (absl::Status s = AdamStep(adam, ++adam_step_, Flat(shard_, layout.shard_numel),
                                Flat(shard_grad_, layout.shard_numel), Flat(adam_m_, layout.shard_numel),
                                Flat(adam_v_, layout.shard_numel));
      !s.ok()) {
    return s;
  }
  std::vector<TensorView> pooled_grads = model_->PooledGradients();
  times->compute_seconds += Since(t);
  t = Clock::now();
  if (absl::Status s = tables_->BackwardAndUpdate(pooled_grads); !s.ok()) return s;
  times->comm_seconds += Since(t);
  return result;
}

absl::StatusOr<std::vector<double>> DistributedModel::Predict(const engine::Batch* batch, engine::Head head) {
  if (batch == nullptr) {
    if (absl::Status s = Lookup(nullptr); !s.ok()) return s;
    return std::vector<double>();
  }
  absl::StatusOr<std::vector<engine::TableLookups>> lookups = model_->TableLookupsOf(*batch);
  if (!lookups.ok()) return lookups.status();
  if (absl::Status s = Lookup(&*lookups); !s.ok()) return s;
  return model_->Predict(*batch, head, pooled_views_);
}

absl::StatusOr<engine::StepResult> DistributedModel::TrainStep(const engine::Batch& batch, Times* times,
                                                               const std::function<absl::Status()>& overlap) {
  absl::StatusOr<engine::StepResult> result = TrainStep(batch, times);
  if (!result.ok() || !overlap) return result;
  if (absl::Status s = overlap(); !s.ok()) return s;
  return result;
}

absl::Status DistributedModel::Save(CheckpointShard* shard) {
  (*shard)["fingerprint"] = fingerprint_;
  (*shard)["adam_step"] = absl::StrCat(adam_step_);
  // Replica 0 of each shard records it; the other replicas hold copies.
  if (groups_->replica()->rank() == 0) {
    const auto [first, end] = DenseRange();
    const int64_t base = dense_->layout().ShardOffset(groups_->fsdp()->rank());
    (*shard)["dense.range"] = absl::StrCat(first, " ", end);
    (*shard)["dense.value"] = FloatRecord(shard_.data() + (first - base), end - first);
    (*shard)["dense.adam_m"] = FloatRecord(adam_m_.data() + (first - base), end - first);
    (*shard)["dense.adam_v"] = FloatRecord(adam_v_.data() + (first - base), end - first);
  }
  if (records_tables_) {
    const int rank = groups_->tables()->rank();
    const dist::EmbeddingShardingPlan& plan = tables_->plan();
    for (int t : plan.TablesOn(rank)) {
      const std::pair<int64_t, int64_t> cols = plan.ColumnRange(t, rank);
      // Every slice of a column-wise table holds the same accumulators; the
      // first slice records them.
      SaveTableBlock(shard, t, config_.dim, tables_->StoredRows(t), cols, tables_->shard(t).as<float>(),
                     cols.first == 0 ? tables_->momentum(t).as<float>() : nullptr);
    }
  }
  return absl::OkStatus();
}

absl::Status DistributedModel::Restore(const std::vector<CheckpointShard>& shards) {
  const auto dense_range = DenseRange();
  const int64_t base = dense_->layout().ShardOffset(groups_->fsdp()->rank());
  int64_t dense_covered = 0;
  std::optional<int64_t> adam_step;
  for (size_t i = 0; i < shards.size(); ++i) {
    const CheckpointShard& s = shards[i];
    absl::StatusOr<int64_t> step = CheckpointAdamStep(s, i, fingerprint_);
    if (!step.ok()) return step.status();
    adam_step = *step;
    if (std::optional<std::pair<int64_t, int64_t>> r = RangeRecord(s, "dense.range")) {
      int64_t n = 0;
      for (auto [key, dst] : {std::pair<const char*, std::vector<float>*>{"dense.value", &shard_},
                              {"dense.adam_m", &adam_m_},
                              {"dense.adam_v", &adam_v_}}) {
        auto rec = s.find(key);
        n = rec == s.end() ? -1 : CopyRecordOverlap(rec->second, *r, 1, dense_range, dst->data() + (dense_range.first - base));
        if (n < 0) return absl::DataLossError(absl::StrCat("checkpoint shard ", i, ": ", key, " does not match its range"));
      }
      dense_covered += n;
    }
  }
  if (dense_covered != dense_range.second - dense_range.first) {
    return absl::DataLossError(absl::StrCat("checkpoint covers ", dense_covered, " of this rank's ",
                                            dense_range.second - dense_range.first, " dense parameters"));
  }
  const int rank = groups_->tables()->rank();
  const dist::EmbeddingShardingPlan& plan = tables_->plan();
  for (int t : plan.TablesOn(rank)) {
    if (absl::Status s = RestoreTableBlock(shards, t, config_.dim, tables_->StoredRows(t), plan.ColumnRange(t, rank),
                                           tables_->shard(t).as<float>(), tables_->momentum(t).as<float>());
        !s.ok()) {
      return s;
    }
  }
  adam_step_ = adam_step.value_or(0);
  return absl::OkStatus();
}

}  // namespace recfleet::worker
