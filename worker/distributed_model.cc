#include "worker/distributed_model.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/gemm/linear.h"
#include "kernels/ops/adam.h"
#include "kernels/ops/grad_clip.h"
#include "worker/dist/staged.h"

namespace recfleet::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The checkpoint slot of a rank's experts (worker/checkpoint.h); its unit
// shards take the others.
constexpr int kExpertSlot = 2;

// The FSDP unit of an engine module (engine::GemLite::ModuleNames): the
// cross branch (final norm, cross-attention, PMA) is one unit, so are the
// two towers; every other module is its own.
std::string UnitOf(const std::string& module) {
  if (module == "seq.final_norm" || module == "cross" || module == "pma") return "cross";
  if (module == "ctr" || module == "cvr") return "heads";
  return module;
}

absl::StatusOr<dist::DeviceBuffer> Floats(Device device, int64_t n) {
  return dist::DeviceBuffer::Zeros(device, static_cast<size_t>(n) * sizeof(float));
}

// A host copy of a flat buffer's floats.
absl::StatusOr<std::vector<float>> ToHost(const dist::DeviceBuffer& b) {
  std::vector<float> host(b.size() / sizeof(float));
  if (absl::Status s = b.CopyToHost(host.data(), host.size() * sizeof(float)); !s.ok()) return s;
  return host;
}

// A host copy of a view's floats.
absl::StatusOr<std::vector<float>> ViewToHost(const TensorView& v) {
  std::vector<float> host(v.numel());
  if (absl::Status s = dist::CopyViewToHost(v, host.data()); !s.ok()) return s;
  return host;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DistributedModel>> DistributedModel::Create(const engine::GemLiteConfig& config,
                                                                           const engine::FeatureSchema& schema,
                                                                           const dist::TrainingGroups* groups,
                                                                           comm::Communicator* world,
                                                                           const std::vector<dist::PlannedTable>& planned_tables,
                                                                           const engine::ExecutionOptions& execution) {
  std::unique_ptr<DistributedModel> m(new DistributedModel());
  m->config_ = config;
  m->groups_ = groups;
  m->world_ = world;
  m->device_ = groups->fsdp()->device();
  if (execution.device != m->device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed model: the engine computes on ", execution.device == Device::kCuda ? "cuda" : "cpu",
        " but the rank's collectives (", groups->fsdp()->backend(), ") work on ",
        m->device_ == Device::kCuda ? "cuda" : "cpu", " buffers; use NCCL groups for a CUDA engine, Gloo for the CPU"));
  }
  // The CPU engine computes in fp32: there the recipe's FP8 modules only
  // name the weights the all-gather carries as FP8. The CUDA engine runs
  // their GEMMs in FP8 on the gathered codes (UnitToEngine).
  engine::GemLiteConfig compute = config;
  if (config.fp8.fp8_all_gather && m->device_ == Device::kCpu) compute.fp8 = engine::Fp8Recipe();
  absl::StatusOr<std::unique_ptr<engine::GemLite<float>>> model =
      engine::GemLite<float>::Create(compute, schema, engine::TableStorage::kExternal, execution);
  if (!model.ok()) return model.status();
  m->model_ = *std::move(model);
  m->expert_span_ = {-1, -1};
  for (const std::string& name : m->model_->DenseParameterNames()) {
    m->dense_params_.push_back(m->model_->DenseParameter(name));
    m->dense_grads_.push_back(m->model_->DenseGradient(name));
    m->dense_offsets_.push_back(m->dense_numel_);
    m->dense_numel_ += m->dense_params_.back().numel();
    if (absl::StartsWith(name, "moe.expert")) {
      if (m->expert_span_.first < 0) m->expert_span_.first = m->dense_offsets_.back();
      if (m->expert_span_.second >= 0 && m->expert_span_.second != m->dense_offsets_.back()) {
        return absl::InternalError(absl::StrCat("dense parameter ", name, ": the experts' parameters are not contiguous"));
      }
      m->expert_span_.second = m->dense_numel_;
    }
  }
  m->fingerprint_ = ModelFingerprint(*m->model_, schema, config.dim);
  if (groups->expert() != nullptr && groups->expert()->size() > 1) {
    absl::StatusOr<std::unique_ptr<dist::ExpertAllToAll>> router =
        dist::ExpertAllToAll::Create(groups->expert(), config.num_experts);
    if (!router.ok()) return router.status();
    m->router_ = *std::move(router);
  }
  if (m->router_ == nullptr || m->expert_span_.first < 0) {
    m->expert_span_ = {m->dense_numel_, m->dense_numel_};
  } else {
    // Every expert has the same shape; blocks of experts are contiguous.
    const int64_t per_expert = (m->expert_span_.second - m->expert_span_.first) / config.num_experts;
    const auto [first, end] = dist::ExpertBlock(config.num_experts, groups->expert()->size(), groups->expert()->rank());
    m->own_experts_ = {m->expert_span_.first + first * per_expert, m->expert_span_.first + end * per_expert};
    m->expert_block_numel_ = dist::ExpertBlock(config.num_experts, groups->expert()->size(), 0).second * per_expert;
  }
  // FSDP units: consecutive engine modules grouped by UnitOf; each module's
  // parameters are contiguous, so each unit's are (the experts' span, when
  // it is cut out, lies inside the "moe" unit).
  m->module_names_ = m->model_->ModuleNames();
  const std::vector<int> param_modules = m->model_->DenseParameterModules();
  m->module_unit_.assign(m->module_names_.size(), -1);
  for (size_t i = 0; i < m->dense_params_.size(); ++i) {
    const int64_t o = m->dense_offsets_[i];
    if (o >= m->expert_span_.first && o < m->expert_span_.second) continue;
    const int module = param_modules[i];
    const std::string name = UnitOf(m->module_names_[module]);
    if (m->module_unit_[module] < 0) {
      if (m->units_.empty() || m->units_.back().name != name) {
        for (const Unit& u : m->units_) {
          if (u.name == name) {
            return absl::InternalError(absl::StrCat("FSDP unit ", name, ": its modules are not consecutive"));
          }
        }
        Unit unit;
        unit.name = name;
        unit.span = {m->Compact(o), m->Compact(o)};
        m->units_.push_back(std::move(unit));
      }
      m->module_unit_[module] = static_cast<int>(m->units_.size()) - 1;
      ++m->units_.back().modules;
    }
    Unit& unit = m->units_[m->module_unit_[module]];
    if (&unit != &m->units_.back() || unit.span.second != m->Compact(o)) {
      return absl::InternalError(absl::StrCat("dense parameter ", i, ": not contiguous with FSDP unit ", unit.name));
    }
    unit.span.second += m->dense_params_[i].numel();
    unit.params.push_back(static_cast<int>(i));
  }
  comm::Communicator* replica = groups->replica()->size() > 1 ? groups->replica() : nullptr;
  int64_t shard_numel = 0, full_numel = 0;
  for (Unit& unit : m->units_) {
    absl::StatusOr<dist::FsdpFlatParameter> fsdp =
        dist::FsdpFlatParameter::Create(unit.span.second - unit.span.first, groups->fsdp(), replica);
    if (!fsdp.ok()) return fsdp.status();
    unit.fsdp.emplace(*std::move(fsdp));
    unit.shard_at = shard_numel;
    unit.full_at = full_numel;
    shard_numel += unit.fsdp->layout().shard_numel;
    full_numel += unit.fsdp->layout().padded_numel;
  }
  if (config.fp8.fp8_all_gather) {
    // Per unit, the FP8 modules' weight matrices in it that the FP8 GEMMs
    // take (unit-relative, in buffer order, each [out, in] as the GEMMs
    // quantize it; biases and every other parameter stay fp32). A unit
    // without one gathers at fp32.
    const std::vector<std::string> names = m->model_->DenseParameterNames();
    for (Unit& unit : m->units_) {
      std::vector<dist::Fp8Matrix> fp8_matrices;
      std::vector<std::string> fp8_names;
      for (const int i : unit.params) {
        if (!absl::EndsWith(names[i], ".w") || !config.fp8.Holds(names[i].substr(0, names[i].size() - 2))) continue;
        const TensorView& w = m->dense_params_[i];
        if (w.rank() != 2) {
          return absl::InternalError(absl::StrCat("fp8 all-gather: weight ", names[i], " is not a matrix: ",
                                                  w.DebugString()));
        }
        // A layer the FP8 GEMMs do not take computes at the model's
        // precision: its weight travels fp32 too.
        if (!Fp8GemmTakesWeight(w.dim(0), w.dim(1))) continue;
        fp8_matrices.push_back({m->Compact(m->dense_offsets_[i]) - unit.span.first, w.dim(0), w.dim(1)});
        fp8_names.push_back(names[i]);
      }
      if (fp8_matrices.empty()) continue;
      // A CUDA engine's FP8 GEMMs take the gathered codes themselves.
      absl::StatusOr<dist::Fp8AllGather> gather = dist::Fp8AllGather::Create(
          unit.fsdp->layout(), groups->fsdp(), std::move(fp8_matrices), /*keep_codes=*/m->device_ == Device::kCuda);
      if (!gather.ok()) return gather.status();
      unit.fp8.emplace(*std::move(gather));
      unit.fp8_names = std::move(fp8_names);
    }
  }
  // Every rank built the same initial parameters (the engine seeds them
  // from the config); each keeps its shards and its experts.
  const int64_t own = m->own_experts_.second - m->own_experts_.first;
  const Device device = m->device_;
  for (auto [buffer, numel] : {std::pair{&m->full_, full_numel}, {&m->full_grad_, full_numel},
                               {&m->shard_, shard_numel}, {&m->shard_grad_, shard_numel},
                               {&m->adam_m_, shard_numel}, {&m->adam_v_, shard_numel},
                               {&m->expert_value_, own}, {&m->expert_grad_, own}, {&m->expert_m_, own},
                               {&m->expert_v_, own}}) {
    absl::StatusOr<dist::DeviceBuffer> b = Floats(device, numel);
    if (!b.ok()) return b.status();
    *buffer = *std::move(b);
  }
  // AdamW over the shard of every unit in one pass (their padding stays
  // zero: zero gradient, zero decay), and over this rank's experts.
  const auto adam_over = [&](const dist::DeviceBuffer& value, const dist::DeviceBuffer& grad,
                             const dist::DeviceBuffer& adam_m, const dist::DeviceBuffer& adam_v,
                             int64_t numel) {
    return MultiTensorAdam::Create(
        {{Flat(value, numel), Flat(grad, numel), Flat(adam_m, numel), Flat(adam_v, numel)}});
  };
  absl::StatusOr<std::unique_ptr<MultiTensorAdam>> shard_adam =
      adam_over(m->shard_, m->shard_grad_, m->adam_m_, m->adam_v_, shard_numel);
  if (!shard_adam.ok()) return shard_adam.status();
  m->shard_adam_ = *std::move(shard_adam);
  if (own > 0) {
    absl::StatusOr<std::unique_ptr<MultiTensorAdam>> expert_adam =
        adam_over(m->expert_value_, m->expert_grad_, m->expert_m_, m->expert_v_, own);
    if (!expert_adam.ok()) return expert_adam.status();
    m->expert_adam_ = *std::move(expert_adam);
  }
  if (config.dense_grad_clip_norm > 0) {
    absl::StatusOr<dist::DeviceBuffer> clip = Floats(device, 3);
    if (!clip.ok()) return clip.status();
    m->clip_ = *std::move(clip);
  }
  if (absl::Status s = m->CopyExperts(m->dense_params_, m->expert_value_, false); !s.ok()) return s;
  for (int u = 0; u < static_cast<int>(m->units_.size()); ++u) {
    if (absl::Status s = m->CopyUnit(u, m->dense_params_, m->full_, false); !s.ok()) return s;
    const dist::FlatShardLayout& layout = m->units_[u].fsdp->layout();
    const TensorView full = m->UnitFull(m->full_, u), shard = m->UnitShard(m->shard_, u);
    if (absl::Status s = dist::CopyOnDevice(device, shard.data,
                                            static_cast<const float*>(full.data) + layout.ShardOffset(groups->fsdp()->rank()),
                                            shard.nbytes());
        !s.ok()) {
      return s;
    }
  }
  m->grads_pending_.assign(m->units_.size(), 0);

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
  const engine::GemLiteConfig init = config;
  if (absl::Status s = m->tables_->Initialize([&init](int t, int64_t row, int64_t col) {
        return static_cast<float>(engine::InitialTableValue(init, t, row, col));
      });
      !s.ok()) {
    return s;
  }
  return m;
}

std::vector<std::string> DistributedModel::unit_names() const {
  std::vector<std::string> names;
  for (const Unit& u : units_) names.push_back(u.name);
  return names;
}

TensorView DistributedModel::UnitShard(const dist::DeviceBuffer& b, int u) const {
  return MakeView(static_cast<float*>(const_cast<void*>(b.data())) + units_[u].shard_at, DType::kFloat32,
                  {units_[u].fsdp->layout().shard_numel}, device_);
}

TensorView DistributedModel::UnitFull(const dist::DeviceBuffer& b, int u) const {
  return MakeView(static_cast<float*>(const_cast<void*>(b.data())) + units_[u].full_at, DType::kFloat32,
                  {units_[u].fsdp->layout().padded_numel}, device_);
}

std::vector<DistributedModel::ShardSlice> DistributedModel::ShardSlices() const {
  std::vector<ShardSlice> slices;
  const int rank = groups_->fsdp()->rank();
  const int64_t experts = expert_span_.second - expert_span_.first;
  for (const Unit& u : units_) {
    const dist::FlatShardLayout& layout = u.fsdp->layout();
    // [first, end) of the FSDP buffer, clipped to the unit's parameters.
    const int64_t first = u.span.first + std::min(layout.ShardOffset(rank), layout.numel);
    const int64_t end = u.span.first + std::min(layout.ShardOffset(rank) + layout.shard_numel, layout.numel);
    const int64_t split = std::clamp(expert_span_.first, first, end);
    if (first < split) slices.push_back({{first, split}, u.shard_at});
    if (split < end) slices.push_back({{split + experts, end + experts}, u.shard_at + (split - first)});
  }
  return slices;
}

absl::Status DistributedModel::CopyUnit(int u, const std::vector<TensorView>& views, const dist::DeviceBuffer& full,
                                        bool to_engine) {
  float* base = static_cast<float*>(const_cast<void*>(full.data())) + units_[u].full_at - units_[u].span.first;
  for (int i : units_[u].params) {
    const TensorView& v = views[i];
    float* flat = base + Compact(dense_offsets_[i]);
    absl::Status s = to_engine ? dist::CopyOnDevice(device_, v.data, flat, v.nbytes())
                               : dist::CopyOnDevice(device_, flat, v.data, v.nbytes());
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status DistributedModel::CopyExperts(const std::vector<TensorView>& views, const dist::DeviceBuffer& experts,
                                           bool to_engine) {
  float* base = static_cast<float*>(const_cast<void*>(experts.data())) - own_experts_.first;
  for (size_t i = 0; i < views.size(); ++i) {
    const int64_t o = dense_offsets_[i];
    if (o < own_experts_.first || o >= own_experts_.second) continue;
    const TensorView& v = views[i];
    absl::Status s = to_engine ? dist::CopyOnDevice(device_, v.data, base + o, v.nbytes())
                               : dist::CopyOnDevice(device_, base + o, v.data, v.nbytes());
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status DistributedModel::UnitToEngine(int u) {
  if (absl::Status s = CopyUnit(u, dense_params_, full_, true); !s.ok()) return s;
  const Unit& unit = units_[u];
  if (!unit.fp8 || device_ != Device::kCuda) return absl::OkStatus();
  for (size_t i = 0; i < unit.fp8_names.size(); ++i) {
    const int m = static_cast<int>(i);
    if (absl::Status s = model_->UseFp8Weight(unit.fp8_names[i], unit.fp8->codes(m), unit.fp8->tile_scales(m));
        !s.ok()) {
      return absl::InternalError(absl::StrCat("fp8 all-gather: ", s.message()));
    }
  }
  return absl::OkStatus();
}

int64_t DistributedModel::dense_gather_bytes() const {
  int64_t bytes = 0;
  for (const Unit& u : units_) {
    bytes += u.fp8 ? u.fp8->slot_bytes() + u.fp8->amax_bytes()
                   : u.fsdp->layout().shard_numel * static_cast<int64_t>(sizeof(float));
  }
  return bytes;
}

int64_t DistributedModel::fp8_gathered_numel() const {
  int64_t n = 0;
  for (const Unit& u : units_) n += u.fp8 ? u.fp8->fp8_numel() : 0;
  return n;
}

absl::Status DistributedModel::GatherForStep() {
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    const absl::Status gathered = units_[u].fp8 ? units_[u].fp8->AllGather(UnitShard(shard_, u), UnitFull(full_, u))
                                                : units_[u].fsdp->AllGather(UnitShard(shard_, u), UnitFull(full_, u));
    if (!gathered.ok()) return gathered;
    if (absl::Status s = UnitToEngine(u); !s.ok()) return s;
  }
  return CopyExperts(dense_params_, expert_value_, true);
}

void DistributedModel::Log(absl::string_view what, absl::string_view name) const {
  if (schedule_log_ != nullptr) schedule_log_->push_back(absl::StrCat(what, " ", name));
}

absl::Status DistributedModel::Waited(const std::function<absl::Status()>& fn) {
  const Clock::time_point t = Clock::now();
  absl::Status s = fn();
  step_wait_seconds_ += Since(t);
  return s;
}

absl::Status DistributedModel::StartGather(int u) {
  absl::StatusOr<std::unique_ptr<comm::PendingCollective>> started =
      units_[u].fp8 ? units_[u].fp8->StartAllGather(UnitShard(shard_, u), UnitFull(full_, u))
                    : units_[u].fsdp->StartAllGather(UnitShard(shard_, u), UnitFull(full_, u));
  if (!started.ok()) return started.status();
  gathers_[u] = *std::move(started);
  Log("gather_start", units_[u].name);
  return absl::OkStatus();
}

absl::Status DistributedModel::MakeReady(int u) {
  while (ready_units_ <= u) {
    const int v = ready_units_;
    if (absl::Status s = Waited([&] { return gathers_[v]->Ready(); }); !s.ok()) return s;
    Log("gather_ready", units_[v].name);
    // The next unit's gather travels while this one computes.
    if (v + 1 < static_cast<int>(units_.size())) {
      if (absl::Status s = Waited([&] { return StartGather(v + 1); }); !s.ok()) return s;
    }
    if (absl::Status s = UnitToEngine(v); !s.ok()) return s;
    ++ready_units_;
  }
  return absl::OkStatus();
}

absl::Status DistributedModel::StartReduce(int u) {
  if (absl::Status s = CopyUnit(u, dense_grads_, full_grad_, false); !s.ok()) return s;
  return Waited([&]() -> absl::Status {
    absl::StatusOr<std::unique_ptr<comm::PendingCollective>> started = units_[u].fsdp->StartReduceScatter(
        UnitFull(full_grad_, u), UnitShard(shard_grad_, u), dist::GradReduction::kSum);
    if (!started.ok()) return started.status();
    reductions_[u] = *std::move(started);
    Log("reduce_start", units_[u].name);
    return absl::OkStatus();
  });
}

absl::Status DistributedModel::BeforeForward(int module) {
  Log("forward", module_names_[module]);
  const int u = module_unit_[module];
  return u < 0 ? absl::OkStatus() : MakeReady(u);
}

absl::Status DistributedModel::AfterBackward(int module) {
  Log("backward_done", module_names_[module]);
  const int u = module_unit_[module];
  if (u < 0 || --grads_pending_[u] > 0) return absl::OkStatus();
  return StartReduce(u);
}

absl::Status DistributedModel::FinishReductions() {
  const int n = static_cast<int>(units_.size());
  // Units whose gradients the backward did not report (none, as long as the
  // engine calls every hook): reduced here.
  for (int u = 0; u < n; ++u) {
    if (reductions_[u] == nullptr) {
      if (absl::Status s = StartReduce(u); !s.ok()) return s;
    }
  }
  return Waited([&]() -> absl::Status {
    // The replica all-reduce of a unit follows its reduce-scatter; all of
    // them travel together.
    std::vector<std::unique_ptr<comm::PendingCollective>> replicas(n);
    for (int u = n - 1; u >= 0; --u) {
      if (absl::Status s = reductions_[u]->Ready(); !s.ok()) return s;
      absl::StatusOr<std::unique_ptr<comm::PendingCollective>> started =
          units_[u].fsdp->StartReplicaReduce(UnitShard(shard_grad_, u), dist::GradReduction::kSum);
      if (!started.ok()) return started.status();
      replicas[u] = *std::move(started);
    }
    // The host waits for each (within the communicators' timeouts), also
    // where Ready did not (NCCL), so a failure surfaces in this step.
    for (int u = n - 1; u >= 0; --u) {
      for (std::unique_ptr<comm::PendingCollective>* p : {&reductions_[u], &replicas[u], &gathers_[u]}) {
        if (*p == nullptr) continue;
        if (absl::Status s = (*p)->Wait(); !s.ok()) return s;
      }
      Log("reduce_ready", units_[u].name);
    }
    return absl::OkStatus();
  });
}

absl::Status DistributedModel::GatherDense() {
  if (absl::Status s = GatherForStep(); !s.ok()) return s;
  if (router_ == nullptr) return absl::OkStatus();
  // Block r of the group starts at expert r x (block size): the gathered
  // blocks are the experts' span in order, padded at the end.
  comm::Communicator& group = *groups_->expert();
  absl::StatusOr<dist::DeviceBuffer> block = Floats(device_, expert_block_numel_);
  if (!block.ok()) return block.status();
  absl::StatusOr<dist::DeviceBuffer> all = Floats(device_, expert_block_numel_ * group.size());
  if (!all.ok()) return all.status();
  if (absl::Status s = dist::CopyOnDevice(device_, block->data(), expert_value_.data(), expert_value_.size()); !s.ok()) {
    return s;
  }
  if (absl::Status s = group.AllGather(Flat(*block, expert_block_numel_), Flat(*all, expert_block_numel_ * group.size()));
      !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < dense_params_.size(); ++i) {
    const int64_t o = dense_offsets_[i];
    if (o >= expert_span_.first && o < expert_span_.second) {
      if (absl::Status s = dist::CopyOnDevice(device_, dense_params_[i].data,
                                              static_cast<const float*>(all->data()) + (o - expert_span_.first),
                                              dense_params_[i].nbytes());
          !s.ok()) {
        return s;
      }
    }
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
    const size_t bytes = static_cast<size_t>(bags * config_.dim) * sizeof(float);
    if (pooled_[t].data() == nullptr || pooled_[t].size() < bytes) {
      absl::StatusOr<dist::DeviceBuffer> b = dist::DeviceBuffer::Zeros(device_, bytes);
      if (!b.ok()) return b.status();
      pooled_[t] = *std::move(b);
    }
    pooled_views_.push_back(pooled_[t].View(DType::kFloat32, {bags, config_.dim}));
  }
  return tables_->Forward(ids, pooled_views_);
}

absl::StatusOr<engine::StepResult> DistributedModel::TrainStep(const engine::Batch& batch, Times* times) {
  const int n = static_cast<int>(units_.size());
  Clock::time_point t = Clock::now();
  if (prefetch_) {
    gathers_.clear();
    gathers_.resize(n);
    reductions_.clear();
    reductions_.resize(n);
    ready_units_ = 0;
    for (int u = 0; u < n; ++u) grads_pending_[u] = units_[u].modules;
    // Unit 0 travels behind the table lookups; the experts are local.
    if (absl::Status s = StartGather(0); !s.ok()) return s;
    if (absl::Status s = CopyExperts(dense_params_, expert_value_, true); !s.ok()) return s;
  } else if (absl::Status s = GatherForStep(); !s.ok()) {
    return s;
  }
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
  std::vector<int64_t> global = {batch.size};
  if (absl::Status s = dist::StagedAllReduce(*world_, global, comm::ReduceOp::kSum); !s.ok()) return s;
  times->comm_seconds += Since(t);
  model_->set_loss_weight(static_cast<double>(batch.size) / static_cast<double>(global[0]));
  // The expert all-to-alls run inside the step; their time counts as
  // compute here, the waits for prefetched units as communication.
  t = Clock::now();
  step_wait_seconds_ = 0;
  if (prefetch_) {
    // bf16 weight copies are refreshed from every unit when the forward
    // starts: every unit must be in by then.
    if (model_->execution().bf16) {
      if (absl::Status s = MakeReady(n - 1); !s.ok()) return s;
    }
    engine::ModuleHooks hooks;
    hooks.before_forward = [this](int module) { return BeforeForward(module); };
    hooks.after_backward = [this](int module) { return AfterBackward(module); };
    model_->SetModuleHooks(std::move(hooks));
  }
  model_->SetExpertRouter(router_.get());
  absl::StatusOr<engine::StepResult> result = model_->ForwardBackward(batch, pooled_views_);
  model_->SetExpertRouter(nullptr);
  model_->SetModuleHooks({});
  if (!result.ok()) return result.status();
  if (prefetch_ && ready_units_ != n) {
    return absl::InternalError(absl::StrCat("the forward used ", ready_units_, " of ", n,
                                            " FSDP units: a module hook is missing"));
  }
  if (!prefetch_) {
    for (int u = 0; u < n; ++u) {
      if (absl::Status s = CopyUnit(u, dense_grads_, full_grad_, false); !s.ok()) return s;
    }
  }
  if (absl::Status s = CopyExperts(dense_grads_, expert_grad_, false); !s.ok()) return s;
  if (absl::Status s = dist::SynchronizeDevice(device_); !s.ok()) return s;
  times->compute_seconds += Since(t) - step_wait_seconds_;
  times->comm_seconds += step_wait_seconds_;
  t = Clock::now();
  if (prefetch_) {
    if (absl::Status s = FinishReductions(); !s.ok()) return s;
  } else {
    for (int u = 0; u < n; ++u) {
      if (absl::Status s = units_[u].fsdp->ReduceGradients(UnitFull(full_grad_, u), UnitShard(shard_grad_, u),
                                                           dist::GradReduction::kSum);
          !s.ok()) {
        return s;
      }
    }
  }
  // Each owned expert's gradient: summed over the expert groups' tokens on
  // this rank already, over the other expert groups here.
  const int64_t own = own_experts_.second - own_experts_.first;
  comm::Communicator* expert_replica = groups_->expert_replica();
  if (own > 0 && expert_replica != nullptr && expert_replica->size() > 1) {
    if (absl::Status s = expert_replica->AllReduce(Flat(expert_grad_, own), comm::ReduceOp::kSum); !s.ok()) return s;
  }
  times->comm_seconds += Since(t);
  t = Clock::now();
  AdamConfig adam;
  adam.lr = config_.learning_rate;
  adam.weight_decay = config_.weight_decay;
  if (config_.dense_grad_clip_norm > 0) {
    if (absl::Status s = ClipScale(&adam); !s.ok()) return s;
  }
  if (absl::Status s = shard_adam_->Step(adam, ++adam_step_); !s.ok()) return s;
  if (expert_adam_ != nullptr) {
    if (absl::Status s = expert_adam_->Step(adam, adam_step_); !s.ok()) return s;
  }
  std::vector<TensorView> pooled_grads = model_->PooledGradients();
  times->compute_seconds += Since(t);
  t = Clock::now();
  if (absl::Status s = tables_->BackwardAndUpdate(pooled_grads); !s.ok()) return s;
  times->comm_seconds += Since(t);
  return result;
}

absl::Status DistributedModel::ClipScale(AdamConfig* adam) {
  float* clip = static_cast<float*>(clip_.data());
  // Parts: the FSDP shards', and the experts' under expert parallelism.
  const TensorView parts = MakeView(clip, DType::kFloat32, {router_ != nullptr ? 2 : 1}, device_);
  const TensorView scale = MakeView(clip + 2, DType::kFloat32, {1}, device_);
  // The sum of squares of one part of the dense gradients into `out`:
  // this rank's slice (final after the reductions; replicas hold equal
  // copies) summed over `group`, the ranks that split the part, then rank 0
  // of `copies` (the replicas of this rank's slice) sends its sum to the
  // others, so every rank gets the same bits whatever order each group's
  // reduction added in. No slice here (adam null): 0.
  const auto part = [&](const MultiTensorAdam* adam, comm::Communicator* group, comm::Communicator* copies,
                        float* out_data) -> absl::Status {
    const TensorView out = MakeView(out_data, DType::kFloat32, {1}, device_);
    if (adam != nullptr) {
      if (absl::Status s = adam->GradSquaredNorm(out, /*accumulate=*/false); !s.ok()) return s;
    } else if (absl::Status s = dist::ZeroOnDevice(device_, out_data, sizeof(float)); !s.ok()) {
      return s;
    }
    if (group != nullptr && group->size() > 1) {
      if (absl::Status s = group->AllReduce(out, comm::ReduceOp::kSum); !s.ok()) return s;
    }
    if (copies != nullptr && copies->size() > 1) {
      if (absl::Status s = copies->Broadcast(out, 0); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  // The FSDP shards split every dense parameter but the experts over the
  // FSDP group (replicated over the replica group); under expert
  // parallelism the experts are split over the expert group (replicated
  // over the expert-replica group; a rank without experts adds 0). So each
  // element is counted once, and the norm is one rank's on the whole model.
  if (absl::Status s = part(shard_adam_.get(), groups_->fsdp(), groups_->replica(), clip); !s.ok()) return s;
  if (router_ != nullptr) {
    if (absl::Status s = part(expert_adam_.get(), groups_->expert(), groups_->expert_replica(), clip + 1); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = GradClipScale(parts, config_.dense_grad_clip_norm, scale); !s.ok()) return s;
  adam->grad_scale = scale;
  return absl::OkStatus();
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

absl::StatusOr<DistributedModel::HostState> DistributedModel::StateToHost() const {
  HostState h;
  const std::pair<std::vector<float>*, const dist::DeviceBuffer*> copies[] = {
      {&h.shard, &shard_},         {&h.adam_m, &adam_m_},     {&h.adam_v, &adam_v_},
      {&h.experts, &expert_value_}, {&h.expert_m, &expert_m_}, {&h.expert_v, &expert_v_}};
  for (const auto& [host, buffer] : copies) {
    absl::StatusOr<std::vector<float>> v = ToHost(*buffer);
    if (!v.ok()) return v.status();
    *host = *std::move(v);
  }
  return h;
}

absl::Status DistributedModel::StateFromHost(const HostState& h) {
  const std::pair<const std::vector<float>*, dist::DeviceBuffer*> copies[] = {
      {&h.shard, &shard_},         {&h.adam_m, &adam_m_},     {&h.adam_v, &adam_v_},
      {&h.experts, &expert_value_}, {&h.expert_m, &expert_m_}, {&h.expert_v, &expert_v_}};
  for (const auto& [host, buffer] : copies) {
    if (absl::Status s = buffer->CopyFromHost(host->data(), host->size() * sizeof(float)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status DistributedModel::Save(CheckpointShard* shard) {
  (*shard)["fingerprint"] = fingerprint_;
  (*shard)["adam_step"] = absl::StrCat(adam_step_);
  absl::StatusOr<HostState> h = StateToHost();
  if (!h.ok()) return h.status();
  // Replica 0 of each shard (expert replica 0 of each expert block)
  // records it; the other replicas hold copies. Slot kExpertSlot holds the
  // experts, the others the parts of the unit shards.
  if (groups_->replica()->rank() == 0) {
    int slot = 0;
    for (const ShardSlice& slice : ShardSlices()) {
      if (slot == kExpertSlot) ++slot;
      SaveDenseSlice(shard, slot++, slice.range, h->shard.data() + slice.at, h->adam_m.data() + slice.at,
                     h->adam_v.data() + slice.at);
    }
  }
  comm::Communicator* expert_replica = groups_->expert_replica();
  if (own_experts_.first < own_experts_.second && (expert_replica == nullptr || expert_replica->rank() == 0)) {
    SaveDenseSlice(shard, kExpertSlot, own_experts_, h->experts.data(), h->expert_m.data(), h->expert_v.data());
  }
  if (records_tables_) {
    const int rank = groups_->tables()->rank();
    const dist::EmbeddingShardingPlan& plan = tables_->plan();
    for (int t : plan.TablesOn(rank)) {
      const std::pair<int64_t, int64_t> cols = plan.ColumnRange(t, rank);
      absl::StatusOr<std::vector<float>> value = ViewToHost(tables_->shard(t));
      if (!value.ok()) return value.status();
      absl::StatusOr<std::vector<float>> momentum = ViewToHost(tables_->momentum(t));
      if (!momentum.ok()) return momentum.status();
      // Every slice of a column-wise table holds the same accumulators; the
      // first slice records them.
      SaveTableBlock(shard, t, config_.dim, tables_->StoredRows(t), cols, value->data(),
                     cols.first == 0 ? momentum->data() : nullptr);
    }
  }
  return absl::OkStatus();
}

absl::Status DistributedModel::Restore(const std::vector<CheckpointShard>& shards) {
  std::optional<int64_t> adam_step;
  for (size_t i = 0; i < shards.size(); ++i) {
    absl::StatusOr<int64_t> step = CheckpointAdamStep(shards[i], i, fingerprint_);
    if (!step.ok()) return step.status();
    adam_step = *step;
  }
  absl::StatusOr<HostState> h = StateToHost();
  if (!h.ok()) return h.status();
  // This rank's ranges of the flat dense vector: its unit shards on either
  // side of the experts, and its own experts.
  struct Slice {
    std::pair<int64_t, int64_t> range;
    float *value, *adam_m, *adam_v;
  };
  std::vector<Slice> slices;
  for (const ShardSlice& slice : ShardSlices()) {
    slices.push_back(
        {slice.range, h->shard.data() + slice.at, h->adam_m.data() + slice.at, h->adam_v.data() + slice.at});
  }
  slices.push_back({own_experts_, h->experts.data(), h->expert_m.data(), h->expert_v.data()});
  for (const Slice& slice : slices) {
    if (slice.range.first >= slice.range.second) continue;
    absl::StatusOr<int64_t> covered = RestoreDenseSlice(shards, slice.range, slice.value, slice.adam_m, slice.adam_v);
    if (!covered.ok()) return covered.status();
    if (*covered != slice.range.second - slice.range.first) {
      return absl::DataLossError(absl::StrCat("checkpoint covers ", *covered, " of this rank's ",
                                              slice.range.second - slice.range.first, " dense parameters [",
                                              slice.range.first, ", ", slice.range.second, ")"));
    }
  }
  if (absl::Status s = StateFromHost(*h); !s.ok()) return s;
  const int rank = groups_->tables()->rank();
  const dist::EmbeddingShardingPlan& plan = tables_->plan();
  for (int t : plan.TablesOn(rank)) {
    const TensorView value = tables_->shard(t), momentum = tables_->momentum(t);
    absl::StatusOr<std::vector<float>> host_value = ViewToHost(value);
    if (!host_value.ok()) return host_value.status();
    absl::StatusOr<std::vector<float>> host_momentum = ViewToHost(momentum);
    if (!host_momentum.ok()) return host_momentum.status();
    if (absl::Status s = RestoreTableBlock(shards, t, config_.dim, tables_->StoredRows(t), plan.ColumnRange(t, rank),
                                           host_value->data(), host_momentum->data());
        !s.ok()) {
      return s;
    }
    if (absl::Status s = dist::CopyHostToView(host_value->data(), value); !s.ok()) return s;
    if (absl::Status s = dist::CopyHostToView(host_momentum->data(), momentum); !s.ok()) return s;
  }
  adam_step_ = adam_step.value_or(0);
  return absl::OkStatus();
}

}  // namespace recfleet::worker
