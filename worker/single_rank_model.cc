#include "worker/single_rank_model.h"

#include <chrono>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace recfleet::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Concatenates views (host or device) into one host vector, in order.
absl::Status Gather(const std::vector<TensorView>& views, std::vector<float>* out) {
  int64_t n = 0;
  for (const TensorView& v : views) n += v.numel();
  out->resize(n);
  int64_t offset = 0;
  for (const TensorView& v : views) {
    if (absl::Status s = engine::CopyViewToHost(v, out->data() + offset); !s.ok()) return s;
    offset += v.numel();
  }
  return absl::OkStatus();
}

// The inverse of Gather.
absl::Status Scatter(const std::vector<float>& in, const std::vector<TensorView>& views) {
  int64_t offset = 0;
  for (const TensorView& v : views) {
    if (absl::Status s = engine::CopyHostToView(in.data() + offset, v); !s.ok()) return s;
    offset += v.numel();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SingleRankModel>> SingleRankModel::Create(const engine::GemLiteConfig& config,
                                                                         const engine::FeatureSchema& schema,
                                                                         const engine::ExecutionOptions& execution) {
  std::unique_ptr<SingleRankModel> m(new SingleRankModel());
  m->config_ = config;
  m->schema_ = schema;
  absl::StatusOr<std::unique_ptr<engine::GemLite<float>>> model =
      engine::GemLite<float>::Create(config, schema, engine::TableStorage::kInternal, execution);
  if (!model.ok()) return model.status();
  m->model_ = *std::move(model);
  m->dense_names_ = m->model_->DenseParameterNames();
  for (const std::string& name : m->dense_names_) m->dense_numel_ += m->model_->DenseParameterView(name).numel();
  m->fingerprint_ = ModelFingerprint(*m->model_, schema, config.dim);
  if (execution.device == Device::kCuda) m->timer_ = std::make_unique<engine::CudaStreamTimer>(4);
  return m;
}

absl::StatusOr<engine::StepResult> SingleRankModel::TrainStep(const engine::Batch& batch, Times* times,
                                                              const std::function<absl::Status()>& overlap) {
  const Clock::time_point start = Clock::now();
  if (timer_ != nullptr) {
    if (absl::Status s = timer_->Mark(0); !s.ok()) return s;
  }
  absl::StatusOr<engine::StepResult> result = model_->ForwardBackward(batch);
  if (!result.ok()) return result.status();
  if (timer_ != nullptr) {
    if (absl::Status s = timer_->Mark(1); !s.ok()) return s;
  }
  // On CUDA the backward is still running: the host loads the next batch.
  double overlap_seconds = 0;
  if (overlap) {
    const Clock::time_point t = Clock::now();
    if (absl::Status s = overlap(); !s.ok()) return s;
    overlap_seconds = Since(t);
  }
  if (timer_ != nullptr) {
    if (absl::Status s = timer_->Mark(2); !s.ok()) return s;
  }
  if (absl::Status s = model_->ApplyUpdates(); !s.ok()) return s;
  if (timer_ == nullptr) {
    times->compute_seconds += Since(start) - overlap_seconds;
    return result;
  }
  if (absl::Status s = timer_->Mark(3); !s.ok()) return s;
  // Waits for the step to finish on the device: the next step's batch
  // checks and host work then see a settled model, and the report is exact.
  absl::StatusOr<double> backward = timer_->Seconds(0, 1);
  absl::StatusOr<double> update = timer_->Seconds(2, 3);
  if (!backward.ok()) return backward.status();
  if (!update.ok()) return update.status();
  times->compute_seconds += *backward + *update;
  return result;
}

absl::StatusOr<std::vector<double>> SingleRankModel::Predict(const engine::Batch* batch, engine::Head head) {
  if (batch == nullptr) return std::vector<double>();
  return model_->Predict(*batch, head);
}

absl::Status SingleRankModel::Save(CheckpointShard* shard) {
  (*shard)["fingerprint"] = fingerprint_;
  (*shard)["adam_step"] = absl::StrCat(model_->adam_step());
  (*shard)["dense.range"] = absl::StrCat(0, " ", dense_numel_);
  std::vector<float> host;
  const std::pair<const char*, int> dense[] = {{"dense.value", 0}, {"dense.adam_m", 1}, {"dense.adam_v", 2}};
  for (const auto& [key, moment] : dense) {
    std::vector<TensorView> views;
    for (const std::string& name : dense_names_) {
      views.push_back(moment == 0 ? model_->DenseParameterView(name) : model_->DenseAdamMoment(name, moment));
    }
    if (absl::Status s = Gather(views, &host); !s.ok()) return s;
    (*shard)[key] = FloatRecord(host.data(), dense_numel_);
  }
  for (int t = 0; t < model_->num_tables(); ++t) {
    const TensorView value = model_->Table(t);
    std::vector<float> momentum;
    if (absl::Status s = Gather({value}, &host); !s.ok()) return s;
    if (absl::Status s = Gather({model_->TableMomentum(t)}, &momentum); !s.ok()) return s;
    SaveTableBlock(shard, t, value.dim(1), {0, value.dim(0)}, {0, value.dim(1)}, host.data(), momentum.data());
  }
  return absl::OkStatus();
}

absl::Status SingleRankModel::Restore(const std::vector<CheckpointShard>& shards) {
  std::vector<float> value(dense_numel_), adam_m(dense_numel_), adam_v(dense_numel_);
  std::optional<int64_t> adam_step;
  const std::pair<int64_t, int64_t> all_dense{0, dense_numel_};
  for (size_t i = 0; i < shards.size(); ++i) {
    const CheckpointShard& s = shards[i];
    absl::StatusOr<int64_t> step = CheckpointAdamStep(s, i, fingerprint_);
    if (!step.ok()) return step.status();
    adam_step = *step;
  }
  absl::StatusOr<int64_t> dense_covered = RestoreDenseSlice(shards, all_dense, value.data(), adam_m.data(), adam_v.data());
  if (!dense_covered.ok()) return dense_covered.status();
  if (!adam_step) return absl::DataLossError("checkpoint has no shards");
  if (*dense_covered != dense_numel_) {
    return absl::DataLossError(absl::StrCat("checkpoint covers ", *dense_covered, " of ", dense_numel_,
                                            " dense parameters"));
  }
  const std::pair<const std::vector<float>*, int> dense[] = {{&value, 0}, {&adam_m, 1}, {&adam_v, 2}};
  for (const auto& [host, moment] : dense) {
    std::vector<TensorView> views;
    for (const std::string& name : dense_names_) {
      views.push_back(moment == 0 ? model_->DenseParameterView(name) : model_->DenseAdamMoment(name, moment));
    }
    if (absl::Status s = Scatter(*host, views); !s.ok()) return s;
  }
  model_->DenseParametersWritten();
  for (int t = 0; t < model_->num_tables(); ++t) {
    const TensorView table = model_->Table(t);
    std::vector<float> values(table.numel()), momentum(table.dim(0));
    if (absl::Status s = RestoreTableBlock(shards, t, table.dim(1), {0, table.dim(0)}, {0, table.dim(1)},
                                           values.data(), momentum.data());
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Scatter(values, {table}); !s.ok()) return s;
    if (absl::Status s = Scatter(momentum, {model_->TableMomentum(t)}); !s.ok()) return s;
  }
  model_->set_adam_step(*adam_step);
  return absl::OkStatus();
}

}  // namespace recfleet::worker
