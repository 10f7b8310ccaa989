#include "worker/rank_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/process_memory.h"
#include "data/dataset_file.h"
#include "engine/cuda_device.h"
#include "engine/job_model.h"
#include "engine/quality_gate.h"
#include "engine/metrics.h"
#include "engine/tensor.h"
#include "spdlog/spdlog.h"
#include "worker/checkpoint.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/dist/layout.h"
#include "worker/distributed_model.h"
#include "worker/rank_data.h"
#include "worker/single_rank_model.h"

namespace recfleet::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string CheckpointPath(const std::string& location) {
  return absl::StartsWith(location, "file://") ? location.substr(7) : location;
}

std::string JobId(const std::string& job_name) {
  return absl::StartsWith(job_name, "jobs/") ? job_name.substr(5) : job_name;
}

// Everything one attempt at a rank holds.
class RankRun {
 public:
  RankRun(const v1::Assignment& a, TaskControl& control, comm::KvStore& store, ProgressSink& sink,
          const TrainingOptions& options, WorkerMetrics* metrics)
      : a_(a), spec_(a.spec()), control_(control), store_(store), options_(options), metrics_(metrics), reporter_(sink) {}

  ~RankRun() {
    if (sample_log_ != nullptr) std::fclose(sample_log_);
  }

  absl::Status Run();

 private:
  // The communicators of one attempt; shared with the stop callback, which
  // may run after the attempt has ended.
  struct Comms {
    std::unique_ptr<comm::Communicator> world;
    std::optional<dist::TrainingGroups> groups;
    void Abort(absl::string_view reason) {
      if (world != nullptr) world->Abort(reason);
      if (!groups.has_value()) return;
      for (comm::Communicator* c :
           {groups->fsdp(), groups->replica(), groups->tables(), groups->table_replica(), groups->expert(),
            groups->expert_replica(), groups->table_shards()}) {
        if (c != nullptr) c->Abort(reason);
      }
    }
  };

  absl::Status Setup();
  absl::Status Connect();
  absl::StatusOr<int64_t> AgreeOnResumeStep();
  absl::Status Restore(int64_t step);
  // A step's batch, loaded (and on CUDA prefetched) before it trains.
  struct Loaded {
    int64_t step = 0;
    engine::Batch batch;
    std::vector<int64_t> sample_ids;  // For the sample log.
  };
  absl::Status Load(int64_t step, Loaded* out);
  absl::Status Step(int64_t step);
  absl::Status Checkpoint(int64_t step);
  absl::Status EvaluateAndReport(int64_t step);
  // model.precision.quality_gate: the shadow run before the job's first
  // step (engine/quality_gate.h); FailedPrecondition when the recipe fails.
  absl::Status RunQualityGate();
  // One line on stderr: samples/s and MFU over the attempt's steps.
  void PrintSummary() const;
  // The peak FLOP/s MFU divides by: the given one, else the CUDA device's
  // datasheet peak by name; none on the CPU.
  void ResolvePeak();
  void LogSamples(const Loaded& loaded);
  bool on_cuda() const { return options_.device == Device::kCuda; }
  engine::ExecutionOptions Execution() const {
    engine::ExecutionOptions exec;
    exec.device = options_.device;
    exec.bf16 = on_cuda() && options_.bf16;
    exec.attention_checkpoint = attention_checkpoint_;
    exec.fp8_saved_activations = job_model_.activation_memory.fp8_saved;
    return exec;
  }
  // StepStats.peak_memory_bytes: the CUDA pool's peak bytes in use, or the
  // process's peak resident bytes since Run() began on the CPU.
  int64_t PeakMemoryBytes() const;
  std::string Describe() const { return absl::StrCat(a_.job(), " rank ", a_.rank(), "/", a_.world_size()); }
  dataloader::ConnectOptions LoaderConnect() const {
    dataloader::ConnectOptions connect;
    connect.credentials = options_.loader_credentials;
    connect.auth_token = options_.auth_token;
    connect.data_grant = a_.data_grant();
    return connect;
  }

  const v1::Assignment& a_;
  const v1::JobSpec& spec_;
  TaskControl& control_;
  comm::KvStore& store_;
  const TrainingOptions& options_;
  WorkerMetrics* metrics_;
  ProgressSink& reporter_;

  engine::JobModel job_model_;
  // ExecutionOptions::attention_checkpoint.
  std::vector<engine::layers::BlockCheckpoint> attention_checkpoint_;
  std::unique_ptr<RankData> train_;
  // This rank's slice of the eval set (every rank evaluates its part).
  std::optional<data::Batch> eval_rows_;
  int64_t eval_first_ = 0, eval_end_ = 0;
  bool has_eval_ = false;
  std::optional<engine::BatchConverter> converter_;
  std::shared_ptr<Comms> comms_;
  std::unique_ptr<RankModel> model_;
  // Two batch slots: the step's and the next one, prefetched during it (the
  // engine keys a prefetch by the Batch object, so batches stay in place).
  Loaded slots_[2];
  std::string checkpoint_dir_;
  std::FILE* sample_log_ = nullptr;
  int64_t samples_done_ = 0;
  // Steps of this attempt after its first (which pays for warm-up), for the
  // summary line at the end.
  struct Totals {
    int64_t steps = 0, samples = 0;
    double flops = 0, step_seconds = 0, compute_seconds = 0, comm_seconds = 0;
  } totals_;
  bool first_step_done_ = false;
  // The peak /metrics divides by, the one the summary line divides by (0:
  // none, "n/a"), and where it comes from.
  double peak_flops_ = 0, summary_peak_flops_ = 0;
  std::string peak_source_;
  double loss_sum_ = 0;
  int64_t loss_steps_ = 0;
};

absl::Status RankRun::Setup() {
  if (on_cuda()) {
    if (absl::Status s = engine::SetCudaDevice(options_.gpu_index); !s.ok()) return s;
  }
  absl::StatusOr<engine::JobModel> jm = engine::BuildJobModel(spec_);
  if (!jm.ok()) return jm.status();
  job_model_ = std::move(*jm);
  // Activation checkpointing as the job asks or the plan chose.
  absl::StatusOr<std::vector<engine::layers::BlockCheckpoint>> recompute =
      engine::AttentionCheckpointModes(job_model_, a_.has_plan() ? &a_.plan() : nullptr);
  if (!recompute.ok()) return recompute.status();
  attention_checkpoint_ = *std::move(recompute);
  // The coordinator derives the data configuration from the spec; an
  // assignment without one (an older coordinator) gets the same derivation.
  v1::DataConfig data = a_.data();
  if (data.job().empty()) {
    absl::StatusOr<v1::DataConfig> derived = engine::BuildDataConfig(spec_, a_.job(), a_.world_size());
    if (!derived.ok()) return derived.status();
    data = *std::move(derived);
  }
  absl::StatusOr<std::unique_ptr<RankData>> train =
      a_.loader_address().empty() ? OpenLocalRankData(data, a_.rank(), options_.datasets)
                                  : OpenLoaderRankData(a_.loader_address(), data, a_.rank(), LoaderConnect());
  if (!train.ok()) return train.status();
  train_ = std::move(*train);
  absl::StatusOr<engine::BatchConverter> conv = engine::BatchConverter::Create(job_model_, train_->schema());
  if (!conv.ok()) return conv.status();
  converter_.emplace(std::move(*conv));
  absl::StatusOr<std::string> eval_file =
      dataloader::ResolveEvalFile(spec_.data().dataset(), spec_.data().eval_dataset(), options_.datasets);
  if (!eval_file.ok()) return eval_file.status();
  has_eval_ = !eval_file->empty();
  if (has_eval_) {
    absl::StatusOr<data::Batch> eval = data::ReadAll(*eval_file);
    if (!eval.ok()) return eval.status();
    if (!(eval->schema() == train_->schema())) {
      return absl::FailedPreconditionError(absl::StrCat(*eval_file, " has another schema than the training data"));
    }
    const int64_t n = static_cast<int64_t>(eval->num_rows());
    eval_first_ = n * a_.rank() / a_.world_size();
    eval_end_ = n * (a_.rank() + 1) / a_.world_size();
    eval_rows_ = std::move(*eval);
  }
  checkpoint_dir_ = spec_.training().checkpoint_dir().empty()
                        ? absl::StrCat(options_.checkpoint_root, "/", JobId(a_.job()))
                        : CheckpointPath(spec_.training().checkpoint_dir());
  if (!options_.sample_log_dir.empty()) {
    const std::string path = absl::StrFormat("%s/%s.rank-%d.epoch-%d.log", options_.sample_log_dir, JobId(a_.job()),
                                             a_.rank(), a_.restart_epoch());
    sample_log_ = std::fopen(path.c_str(), "a");
    if (sample_log_ == nullptr) return absl::InternalError(absl::StrCat("cannot open sample log ", path));
  }
  return absl::OkStatus();
}

absl::Status RankRun::Connect() {
  comm::KvStore& store = store_;
  absl::StatusOr<std::shared_ptr<comm::GlooTransport>> transport = comm::GlooTransport::Create(options_.gloo_host);
  if (!transport.ok()) return transport.status();
  comm::CommOptions comm_options;
  comm_options.timeout = options_.comm_timeout;
  comms_ = std::make_shared<Comms>();
  absl::StatusOr<std::unique_ptr<comm::Communicator>> world =
      comm::ConnectGloo(store, a_.rank(), a_.world_size(), *transport, comm_options);
  if (!world.ok()) return world.status();
  comms_->world = std::move(*world);
  if (on_cuda() && a_.world_size() == 1) {
    // A world of one has nothing to exchange: the engine's own tables and
    // optimizers, the whole step on the device (the same parameters as
    // DistributedModel on one rank, without its flat-buffer copies).
    std::shared_ptr<Comms> comms = comms_;
    control_.OnStop([comms] { comms->Abort("task stopped by the worker (abort or shutdown)"); });
    absl::StatusOr<std::unique_ptr<SingleRankModel>> model =
        SingleRankModel::Create(job_model_.config, job_model_.schema, Execution());
    if (!model.ok()) return model.status();
    model_ = *std::move(model);
    spdlog::info("{}", absl::StrFormat("%s trains on CUDA device %d (%s), a world of one", Describe().c_str(),
                                       options_.gpu_index, options_.bf16 ? "bf16" : "fp32"));
    return absl::OkStatus();
  }

  // The plan's groups (or the spec's hints) decide the dense and sparse
  // layouts.
  std::vector<dist::NamedGroup> plan_groups;
  for (const v1::ProcessGroup& g : a_.groups()) plan_groups.push_back({g.name(), {g.ranks().begin(), g.ranks().end()}});
  const v1::ParallelismHints& h = spec_.parallelism();
  absl::StatusOr<std::vector<comm::ProcessGroupSpec>> specs = dist::TrainingGroupSpecs(
      a_.rank(), a_.world_size(), plan_groups, {h.fsdp_group_size(), h.replicas(), h.table_sharding_group_size()});
  if (!specs.ok()) return specs.status();
  // The world stays on Gloo (host integers: resume step, eval, barriers);
  // the training groups run where the rank trains: NCCL between GPUs, each
  // group's unique id published in `store` (the coordinator's key-value
  // store for a daemon) under the group's namespace.
  const int gpu = options_.gpu_index;
  const comm::CommFactory factory = [&](comm::KvStore& s, int rank, int size) {
    return on_cuda() ? comm::ConnectNccl(s, rank, size, gpu, comm_options)
                     : comm::ConnectGloo(s, rank, size, *transport, comm_options);
  };
  absl::StatusOr<dist::TrainingGroups> groups = dist::TrainingGroups::BuildFromSpecs(a_.rank(), *specs, store, factory);
  if (!groups.ok()) return groups.status();
  comms_->groups.emplace(*std::move(groups));
  // Registered once every communicator exists (the callback may run on
  // another thread at any time after this; at once if a stop came already).
  std::shared_ptr<Comms> comms = comms_;
  control_.OnStop([comms] { comms->Abort("task stopped by the worker (abort or shutdown)"); });
  if (a_.rank() == 0) {
    spdlog::info("{}", absl::StrFormat("%s layout: FSDP groups of %d x %d replicas, tables over %d x %d copies%s, "
                                       "experts over groups of %d",
                                       Describe().c_str(), comms_->groups->fsdp()->size(),
                                       comms_->groups->replica()->size(), comms_->groups->tables()->size(),
                                       comms_->groups->table_replica()->size(),
                                       a_.plan().sparse().tables_size() > 0 ? " as planned" : " (balanced, no plan)",
                                       comms_->groups->expert() != nullptr ? comms_->groups->expert()->size() : 1));
  }
  // The plan's table placements, when the coordinator planned the job.
  std::vector<dist::PlannedTable> planned_tables;
  for (const v1::TableShardingPlan& t : a_.plan().sparse().tables()) {
    planned_tables.push_back({t.table(), t.sharding(), t.num_shards(), {t.ranks().begin(), t.ranks().end()}});
  }
  absl::StatusOr<std::unique_ptr<DistributedModel>> model = DistributedModel::Create(
      job_model_.config, job_model_.schema, &*comms_->groups, comms_->world.get(), planned_tables, Execution());
  if (!model.ok()) return model.status();
  model_ = *std::move(model);
  if (on_cuda()) {
    spdlog::info("{}", absl::StrFormat("%s trains on CUDA device %d (%s), rank %d of %d over NCCL", Describe().c_str(),
                                       gpu, options_.bf16 ? "bf16" : "fp32", a_.rank(), a_.world_size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RankRun::AgreeOnResumeStep() {
  // Rank 0 decides, so every rank restores the same checkpoint even if one
  // is being pruned or written as they look. The assignment's resume_step
  // is the coordinator's estimate from reported progress, which can run
  // ahead of the last committed checkpoint (a rank killed between reporting
  // a step and committing its checkpoint), so the newest complete
  // checkpoint on disk wins.
  int64_t step = 0;
  if (a_.rank() == 0) {
    // No rank of this attempt has written yet: any partial shard is left
    // by a rank of an earlier attempt that died mid-write.
    if (absl::Status s = RemovePartialCheckpointFiles(checkpoint_dir_); !s.ok()) return s;
    absl::StatusOr<std::optional<int64_t>> latest = LatestCompleteCheckpoint(checkpoint_dir_, a_.world_size());
    if (!latest.ok()) return latest.status();
    step = latest->value_or(0);
    if (step != a_.resume_step()) {
      spdlog::warn("{}", absl::StrFormat("%s: assignment says resume at step %lld, newest complete checkpoint is %lld",
                                         Describe().c_str(), static_cast<long long>(a_.resume_step()),
                                         static_cast<long long>(step)));
    }
  }
  if (absl::Status s = comms_->world->Broadcast(MakeView(&step, DType::kInt64, {1}), 0); !s.ok()) return s;
  return step;
}

absl::Status RankRun::Restore(int64_t step) {
  std::vector<CheckpointShard> shards;
  for (int r = 0; r < a_.world_size(); ++r) {
    absl::StatusOr<CheckpointShard> shard = ReadCheckpointShard(checkpoint_dir_, step, r, a_.world_size());
    if (!shard.ok()) return shard.status();
    shards.push_back(*std::move(shard));
  }
  if (absl::Status s = model_->Restore(shards); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("checkpoint step ", step, " in ", checkpoint_dir_, ": ", s.message()));
  }
  if (!absl::SimpleAtoi(shards[a_.rank()]["samples"], &samples_done_)) {
    return absl::DataLossError(absl::StrCat("checkpoint step ", step, " shard ", a_.rank(), " has no sample count"));
  }
  spdlog::info("{}", absl::StrFormat("%s resumed from checkpoint step %lld in %s (optimizer state included)",
                                     Describe().c_str(), static_cast<long long>(step), checkpoint_dir_.c_str()));
  return absl::OkStatus();
}

absl::Status RankRun::Checkpoint(int64_t step) {
  const Clock::time_point start = Clock::now();
  CheckpointShard shard;
  if (absl::Status s = model_->Save(&shard); !s.ok()) return s;
  shard["samples"] = absl::StrCat(samples_done_);
  shard["step"] = absl::StrCat(step);
  if (absl::Status s = WriteCheckpointShard(checkpoint_dir_, step, a_.rank(), a_.world_size(), shard); !s.ok()) {
    return s;
  }
  if (absl::Status s = comms_->world->Barrier(); !s.ok()) return s;
  if (a_.rank() == 0) {
    if (absl::Status s = CommitCheckpoint(checkpoint_dir_, step, a_.world_size()); !s.ok()) return s;
    if (absl::Status s = PruneCheckpoints(checkpoint_dir_, a_.world_size(), options_.keep_checkpoints); !s.ok()) {
      return s;
    }
  }
  metrics_->RecordCheckpoint(Since(start));
  return absl::OkStatus();
}

void RankRun::LogSamples(const Loaded& loaded) {
  if (sample_log_ == nullptr) return;
  std::string line = absl::StrCat(loaded.step);
  for (int64_t id : loaded.sample_ids) absl::StrAppend(&line, " ", id);
  line += "\n";
  std::fwrite(line.data(), 1, line.size(), sample_log_);
  // Into the kernel at once: a SIGKILL right after must not lose the line.
  std::fflush(sample_log_);
}

absl::Status RankRun::Load(int64_t step, Loaded* out) {
  std::vector<int64_t> rows;
  absl::StatusOr<const data::Batch*> source = train_->Step(step, &rows);
  if (!source.ok()) return source.status();
  out->step = step;
  out->batch = converter_->Convert(**source, rows);
  out->sample_ids.clear();
  if (sample_log_ != nullptr) {
    for (int64_t row : rows) {
      const int64_t id = converter_->SampleId(**source, row);
      out->sample_ids.push_back(id >= 0 ? id : row);
    }
  }
  return absl::OkStatus();
}

absl::Status RankRun::Step(int64_t step) {
  StepTimes times;
  const Clock::time_point start = Clock::now();
  Loaded& now = slots_[step % 2];
  // The previous step loaded this one during its compute; the first step
  // of an attempt loads its own.
  if (now.step != step) {
    if (absl::Status s = Load(step, &now); !s.ok()) return s;
  }
  const engine::Batch& batch = now.batch;
  const int64_t steps = spec_.training().steps();
  RankModel::Times split;
  absl::StatusOr<engine::StepResult> result = model_->TrainStep(batch, &split, [&]() -> absl::Status {
    if (step >= steps) return absl::OkStatus();
    Loaded& next = slots_[(step + 1) % 2];
    if (absl::Status s = Load(step + 1, &next); !s.ok()) return s;
    return model_->Prefetch(next.batch);
  });
  if (!result.ok()) return result.status();
  if (!std::isfinite(result->ctr_loss) || !std::isfinite(result->cvr_loss)) {
    // The step has already applied its non-finite gradients: stop here, so
    // that a cluster job resumes from its last checkpoint (the coordinator's
    // restart, up to training.max_restarts) instead of training on and
    // checkpointing NaN parameters.
    return absl::AbortedError(absl::StrFormat(
        "%s: training diverged at step %lld: the loss is not finite (ctr %g, cvr %g) on this rank's batch of %lld "
        "samples; stopped so that no checkpoint holds the non-finite parameters (lower training.dense_learning_rate or "
        "sparse_learning_rate, set training.dense_grad_clip_norm, or run fewer model.precision.fp8_modules)",
        Describe().c_str(), static_cast<long long>(step), result->ctr_loss, result->cvr_loss,
        static_cast<long long>(batch.size)));
  }
  times.compute_seconds = split.compute_seconds;
  times.comm_seconds = split.comm_seconds;
  times.step_seconds = Since(start);
  // What the device neither computed nor communicated: batch loading and
  // host work it could not hide.
  times.data_wait_seconds = std::max(0.0, times.step_seconds - times.compute_seconds - times.comm_seconds);
  LogSamples(now);
  samples_done_ += batch.size;
  const double loss = result->ctr_loss + result->cvr_loss;
  loss_sum_ += loss;
  ++loss_steps_;
  metrics_->RecordStep(step, batch.size, result->flops, loss, times);
  if (first_step_done_) {
    ++totals_.steps;
    totals_.samples += batch.size;
    totals_.flops += result->flops;
    totals_.step_seconds += times.step_seconds;
    totals_.compute_seconds += times.compute_seconds;
    totals_.comm_seconds += times.comm_seconds;
  }
  first_step_done_ = true;
  v1::StepStats stats;
  stats.set_step(step);
  stats.set_samples(batch.size);
  stats.set_step_seconds(times.step_seconds);
  stats.set_data_wait_seconds(times.data_wait_seconds);
  stats.set_compute_seconds(times.compute_seconds);
  stats.set_comm_seconds(times.comm_seconds);
  stats.set_loss(loss);
  stats.set_peak_memory_bytes(PeakMemoryBytes());
  reporter_.ReportStep(stats);
  if (options_.log_every > 0 && step % options_.log_every == 0) {
    spdlog::info("{}",
                 absl::StrFormat("%s step %lld/%lld loss %.4f | %.0f samples/s, %.2f useful GFLOP/s | step %.1f ms "
                                 "(data %.1f, compute %.1f, comm %.1f)",
                                 Describe().c_str(), static_cast<long long>(step),
                                 static_cast<long long>(spec_.training().steps()), loss_sum_ / loss_steps_,
                                 metrics_->samples_per_second(), metrics_->useful_flops_per_second() * 1e-9,
                                 times.step_seconds * 1e3, times.data_wait_seconds * 1e3, times.compute_seconds * 1e3,
                                 times.comm_seconds * 1e3));
    loss_sum_ = 0;
    loss_steps_ = 0;
  }
  return reporter_.Flush(/*force=*/false);
}

int64_t RankRun::PeakMemoryBytes() const {
  if (on_cuda()) {
    absl::StatusOr<engine::DeviceMemoryStats> m = engine::CudaMemoryStats();
    return m.ok() ? static_cast<int64_t>(m->peak) : 0;
  }
  absl::StatusOr<int64_t> peak = PeakResidentBytes();
  return peak.ok() ? *peak : 0;
}

absl::Status RankRun::EvaluateAndReport(int64_t step) {
  // Every rank scores its slice of the eval set (the tables are sharded, so
  // every rank serves lookups in every round); rank 0 gathers the logits.
  if (!has_eval_) return absl::OkStatus();
  if (absl::Status s = model_->GatherDense(); !s.ok()) return s;
  const int64_t bs = engine::EvalBatchSize(spec_);
  const int64_t total = static_cast<int64_t>(eval_rows_->num_rows());
  const int64_t per_rank = (total + a_.world_size() - 1) / a_.world_size();  // >= every rank's slice.
  const bool ctr = !job_model_.ctr_label.empty();
  // (logit, label) pairs, label -1 past this rank's slice.
  std::vector<double> mine(2 * per_rank, -1.0);
  std::vector<int64_t> idx;
  for (int64_t round = 0; round * bs < per_rank; ++round) {
    const int64_t first = eval_first_ + round * bs;
    const int64_t end = std::min(eval_end_, first + bs);
    std::optional<engine::Batch> batch;
    if (first < end) {
      idx.resize(end - first);
      std::iota(idx.begin(), idx.end(), first);
      batch = converter_->Convert(*eval_rows_, idx);
    }
    absl::StatusOr<std::vector<double>> z =
        model_->Predict(batch ? &*batch : nullptr, ctr ? engine::Head::kCtr : engine::Head::kCvr);
    if (!z.ok()) return z.status();
    if (!batch) continue;
    const std::vector<float>& labels = ctr ? batch->ctr_labels : batch->cvr_labels;
    for (size_t i = 0; i < z->size(); ++i) {
      mine[2 * (first - eval_first_ + i)] = (*z)[i];
      mine[2 * (first - eval_first_ + i) + 1] = labels[i];
    }
  }
  std::vector<double> all(mine.size() * a_.world_size());
  if (absl::Status s = comms_->world->AllGather(MakeView(mine.data(), DType::kFloat64, {2 * per_rank}),
                                                MakeView(all.data(), DType::kFloat64, {2 * per_rank * a_.world_size()}));
      !s.ok()) {
    return s;
  }
  if (a_.rank() != 0) return absl::OkStatus();
  std::vector<double> logits, labels;
  for (size_t i = 0; i < all.size(); i += 2) {
    if (all[i + 1] < 0) continue;
    logits.push_back(all[i]);
    labels.push_back(all[i + 1]);
  }
  absl::StatusOr<engine::BinaryMetrics> m = engine::ComputeBinaryMetrics(logits, labels);
  if (!m.ok()) return m.status();
  metrics_->RecordEval(m->auc, m->normalized_entropy);
  v1::EvalStats eval;
  eval.set_step(step);
  eval.set_auc(m->auc);
  eval.set_ne(m->normalized_entropy);
  reporter_.ReportEval(eval);
  spdlog::info("{}", absl::StrFormat("%s eval at step %lld: AUC %.4f NE %.4f log loss %.4f (%lld samples)",
                                     Describe().c_str(), static_cast<long long>(step), m->auc, m->normalized_entropy,
                                     m->log_loss, static_cast<long long>(m->count)));
  return reporter_.Flush(/*force=*/true);
}

absl::Status RankRun::RunQualityGate() {
  const engine::JobModel::QualityGate& gate = job_model_.quality_gate;
  if (!on_cuda() || a_.world_size() != 1) {
    return absl::FailedPreconditionError(
        "spec.model.precision.quality_gate: the shadow run needs a GPU job of one rank (resources.gpus_per_worker = "
        "1, workers = 1)");
  }
  if (!has_eval_ || job_model_.ctr_label.empty()) {
    return absl::FailedPreconditionError(
        "spec.model.precision.quality_gate: compares the CTR head's eval NE, so the job needs a CTR head and an eval "
        "set (data.eval_dataset, or eval.rfd next to the dataset)");
  }
  // The job's own first batches (the steps it is about to train), loaded
  // again for the second model; eval on the first eval_samples rows.
  Loaded loaded;
  auto batch = [&](int s) -> absl::StatusOr<const engine::Batch*> {
    if (absl::Status st = Load(s + 1, &loaded); !st.ok()) return st;
    return &loaded.batch;
  };
  const int64_t bs = engine::EvalBatchSize(spec_);
  const int64_t n = std::min<int64_t>(gate.eval_samples, eval_end_ - eval_first_);
  std::vector<engine::Batch> eval;
  std::vector<int64_t> idx;
  for (int64_t first = eval_first_; first < eval_first_ + n; first += bs) {
    idx.resize(std::min(bs, eval_first_ + n - first));
    std::iota(idx.begin(), idx.end(), first);
    eval.push_back(converter_->Convert(*eval_rows_, idx));
  }
  // The job's own execution: its activation checkpointing (so the shadow
  // models' activations are those the plan counted for the job's step) and
  // FP8-saved activations (the recipe's; the bf16 models drop them).
  const engine::ExecutionOptions exec = Execution();
  spdlog::info("{}", absl::StrFormat("%s quality gate: shadow run of %d steps, the recipe and without it%s",
                                     Describe().c_str(), gate.shadow_steps,
                                     gate.runs > 1 ? absl::StrCat(" (", gate.runs, " runs each)") : std::string()));
  absl::StatusOr<engine::NeComparison> c = engine::RunShadowComparison(job_model_.config, job_model_.schema, exec,
                                                                      gate.shadow_steps, batch, eval,
                                                                      gate.runs);
  if (!c.ok()) {
    return absl::Status(c.status().code(),
                        absl::StrCat("spec.model.precision.quality_gate: shadow run: ", c.status().message()));
  }
  if (absl::Status s = engine::CheckNeGate(*c, gate.max_relative_ne_increase); !s.ok()) return s;
  spdlog::info("{}", absl::StrFormat("%s quality gate passed: %s (tolerance +%g%%)", Describe().c_str(),
                                     c->Describe().c_str(), 100 * gate.max_relative_ne_increase));
  return absl::OkStatus();
}

absl::Status RankRun::Run() {
  if (!on_cuda()) {
    // The rank's peak, not an earlier task's: a worker runs one task at a
    // time, so the process's peak from here on is this rank's.
    if (absl::Status s = ResetPeakResident(); !s.ok()) {
      spdlog::warn("{}", absl::StrFormat("%s: %s; its peak memory may be an earlier task's", Describe().c_str(),
                                         std::string(s.message()).c_str()));
    }
  }
  ResolvePeak();
  metrics_->StartTask(a_.job(), a_.rank(), a_.world_size(), peak_flops_);
  // However the task ends, its info series leaves /metrics with it.
  absl::Cleanup end_task = [this] { metrics_->EndTask(); };
  if (absl::Status s = Setup(); !s.ok()) return s;
  if (absl::Status s = Connect(); !s.ok()) return s;
  absl::StatusOr<int64_t> resume = AgreeOnResumeStep();
  if (!resume.ok()) return resume.status();
  if (*resume > 0) {
    if (absl::Status s = Restore(*resume); !s.ok()) return s;
  } else if (job_model_.quality_gate.enabled()) {
    if (absl::Status s = RunQualityGate(); !s.ok()) return s;
  }
  control_.SetRunning();
  const int64_t steps = spec_.training().steps();
  const int64_t ckpt_every = spec_.training().checkpoint_every();
  const int64_t eval_every = spec_.training().eval_every();
  spdlog::info("{}",
               absl::StrFormat("%s training steps %lld..%lld, %lld samples per rank-step, checkpoints in %s",
                               Describe().c_str(), static_cast<long long>(*resume + 1), static_cast<long long>(steps),
                               static_cast<long long>(spec_.data().local_batch_size()), checkpoint_dir_.c_str()));
  for (int64_t step = *resume + 1; step <= steps; ++step) {
    if (control_.stop_requested()) return absl::CancelledError(absl::StrCat(Describe(), " stopped at step ", step));
    if (absl::Status s = Step(step); !s.ok()) return s;
    if (ckpt_every > 0 && step % ckpt_every == 0 && step < steps) {
      if (absl::Status s = Checkpoint(step); !s.ok()) return s;
    }
    if (eval_every > 0 && step % eval_every == 0 && step < steps) {
      if (absl::Status s = EvaluateAndReport(step); !s.ok()) return s;
    }
  }
  if (absl::Status s = Checkpoint(steps); !s.ok()) return s;
  if (absl::Status s = EvaluateAndReport(steps); !s.ok()) return s;
  PrintSummary();
  return reporter_.Flush(/*force=*/true);
}

void RankRun::ResolvePeak() {
  if (!on_cuda()) {
    peak_flops_ = kCpuNominalPeakFlops;
    summary_peak_flops_ = 0;
    peak_source_ = absl::StrFormat("cpu: no datasheet peak for a CPU rank; /metrics divides by a nominal %.3g FLOP/s",
                                   kCpuNominalPeakFlops);
    return;
  }
  const std::string precision = options_.bf16 ? "cuda bf16" : "cuda fp32";
  peak_flops_ = options_.cuda_peak_flops;
  peak_source_ = precision + ", the given peak";
  if (peak_flops_ <= 0) {
    std::string name = absl::StrCat("CUDA device ", options_.gpu_index);
    absl::StatusOr<std::vector<engine::CudaDeviceInfo>> devices = engine::ListCudaDevices();
    if (devices.ok()) {
      for (const engine::CudaDeviceInfo& d : *devices) {
        if (d.index == options_.gpu_index) name = d.name;
      }
    }
    peak_flops_ = PeakBf16FlopsOf(name);
    peak_source_ = peak_flops_ > 0 ? absl::StrCat(precision, ", dense bf16 datasheet peak of ", name)
                                   : absl::StrCat(precision, ": no known peak for ", name, " (recfleet-worker --peak_flops)");
  }
  summary_peak_flops_ = peak_flops_;
}

void RankRun::PrintSummary() const {
  if (totals_.steps == 0 || totals_.step_seconds <= 0) return;
  spdlog::info("{}", absl::StrFormat("%s summary over %lld steps after the first: %.1f samples/s, step %.2f ms "
                                     "(compute %.2f, comm %.2f), %.2f useful TFLOP/s, %s",
                                     Describe().c_str(), static_cast<long long>(totals_.steps),
                                     totals_.samples / totals_.step_seconds, 1e3 * totals_.step_seconds / totals_.steps,
                                     1e3 * totals_.compute_seconds / totals_.steps,
                                     1e3 * totals_.comm_seconds / totals_.steps,
                                     totals_.flops / totals_.step_seconds * 1e-12,
                                     MfuSummary(totals_.flops, totals_.compute_seconds, totals_.step_seconds,
                                                summary_peak_flops_, peak_source_)));
}

}  // namespace

absl::Status RunRank(const v1::Assignment& assignment, TaskControl& control, comm::KvStore& store, ProgressSink& sink,
                     const TrainingOptions& options, WorkerMetrics* metrics) {
  RankRun run(assignment, control, store, sink, options, metrics);
  return run.Run();
}

}  // namespace recfleet::worker
