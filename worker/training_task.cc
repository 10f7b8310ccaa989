#include "worker/training_task.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "data/dataset_file.h"
#include "engine/metrics.h"
#include "engine/model.h"
#include "grpcpp/grpcpp.h"
#include "worker/loader_rank_data.h"
#include "worker/rank_data.h"
#include "worker/checkpoint.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/grpc_kv_store.h"
#include "worker/job_model.h"

namespace recfleet::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string StripScheme(const std::string& location) {
  return absl::StartsWith(location, "file://") ? location.substr(7) : location;
}

// spec.data.dataset / eval_dataset: a .rfd file, or a directory holding
// train.rfd and eval.rfd (what `recfleet data synth` and `ingest` write).
struct DataFiles {
  std::string train;
  std::string eval;  // "" = no evaluation.
};

absl::StatusOr<DataFiles> ResolveData(const v1::DataSpec& data) {
  DataFiles files;
  const std::string train = StripScheme(data.dataset());
  if (train.empty()) return absl::InvalidArgumentError("spec.data.dataset is empty; expected a .rfd file or directory");
  files.train = IsDirectory(train) ? train + "/train.rfd" : train;
  const std::string eval = StripScheme(data.eval_dataset());
  if (!eval.empty()) {
    files.eval = IsDirectory(eval) ? eval + "/eval.rfd" : eval;
  } else if (IsDirectory(train) && Exists(train + "/eval.rfd")) {
    files.eval = train + "/eval.rfd";
  }
  return files;
}

// The rank's training data: streamed by the job's data-loader, or read from
// the dataset file when the assignment names no loader.
absl::StatusOr<std::unique_ptr<RankData>> OpenRankData(const std::string& loader_address,
                                                       const std::string& train_file, int rank, int world_size,
                                                       int64_t local_batch, uint64_t seed) {
  if (!loader_address.empty()) return OpenLoaderRankData(loader_address, rank, local_batch);
  if (!Exists(train_file)) {
    return absl::NotFoundError(absl::StrCat("spec.data.dataset: ", train_file, " does not exist on this worker"));
  }
  return OpenDatasetRankData(train_file, rank, world_size, local_batch, seed);
}

std::string JobId(const std::string& job_name) {
  return absl::StartsWith(job_name, "jobs/") ? job_name.substr(5) : job_name;
}

// Every trainable tensor of the model in a fixed order (dense parameters by
// name, then the tables), seen as one flat vector for checkpoints.
struct ParameterLayout {
  std::vector<std::string> names;
  std::vector<TensorView> views;
  int64_t dense_numel = 0;
  int64_t total_numel = 0;
  std::vector<TensorView> dense_grads;

  std::string Fingerprint() const {
    std::string out;
    for (size_t i = 0; i < names.size(); ++i) absl::StrAppend(&out, names[i], ":", views[i].numel(), ";");
    return out;
  }
};

ParameterLayout LayoutOf(engine::GemLite<float>& model) {
  ParameterLayout p;
  for (const std::string& name : model.DenseParameterNames()) {
    p.names.push_back(name);
    p.views.push_back(model.DenseParameter(name));
    p.dense_grads.push_back(model.DenseGradient(name));
    p.dense_numel += p.views.back().numel();
  }
  for (int t = 0; t < model.num_tables(); ++t) {
    p.names.push_back(absl::StrCat("table.", t));
    p.views.push_back(model.Table(t));
  }
  for (const TensorView& v : p.views) p.total_numel += v.numel();
  return p;
}

// Copies between a list of fp32 views and one flat buffer.
void Gather(const std::vector<TensorView>& views, std::vector<float>* flat, size_t offset = 0) {
  for (const TensorView& v : views) {
    std::memcpy(flat->data() + offset, v.data, v.nbytes());
    offset += v.numel();
  }
}
void Scatter(const std::vector<float>& flat, const std::vector<TensorView>& views, size_t offset = 0) {
  for (const TensorView& v : views) {
    std::memcpy(v.data, flat.data() + offset, v.nbytes());
    offset += v.numel();
  }
}

// The slice [begin, end) of the flat parameters rank `rank` stores.
std::pair<int64_t, int64_t> ShardRange(int64_t n, int rank, int world) {
  return {n * rank / world, n * (rank + 1) / world};
}

// Sends batched step reports; stops the task on a fencing error.
class Reporter {
 public:
  Reporter(v1::WorkerService::StubInterface* stub, const v1::Assignment& a, const std::string& worker_id,
           const std::string& token)
      : stub_(stub), token_(token) {
    pending_.set_worker_id(worker_id);
    pending_.set_job(a.job());
    pending_.set_restart_epoch(a.restart_epoch());
    pending_.set_rank(a.rank());
  }
  void AddStep(const v1::StepStats& s) { *pending_.add_steps() = s; }
  void SetEval(const v1::EvalStats& e) { *pending_.mutable_eval() = e; }

  // Sends what is pending if `force` or half a second has passed.
  absl::Status Flush(bool force) {
    if (pending_.steps_size() == 0 && !pending_.has_eval()) return absl::OkStatus();
    if (!force && Since(last_) < 0.5) return absl::OkStatus();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!token_.empty()) ctx.AddMetadata("authorization", "Bearer " + token_);
    v1::ReportStepResponse resp;
    grpc::Status s = stub_->ReportStep(&ctx, pending_, &resp);
    last_ = Clock::now();
    pending_.clear_steps();
    pending_.clear_eval();
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      return absl::FailedPreconditionError(absl::StrCat("ReportStep: ", s.error_message()));
    }
    if (!s.ok()) {
      // Progress reports are advisory; training continues through a
      // coordinator hiccup, and the lease (heartbeats) decides liveness.
      std::fprintf(stderr, "worker: ReportStep failed: %s\n", s.error_message().c_str());
    }
    return absl::OkStatus();
  }

 private:
  v1::WorkerService::StubInterface* stub_;
  const std::string token_;
  v1::ReportStepRequest pending_;
  Clock::time_point last_ = Clock::now();
};

absl::StatusOr<engine::BinaryMetrics> Evaluate(engine::GemLite<float>& model, const BatchConverter& conv,
                                               const data::Batch& rows, int64_t batch_size) {
  std::vector<double> logits, labels;
  std::vector<int64_t> idx;
  const int64_t n = static_cast<int64_t>(rows.num_rows());
  for (int64_t start = 0; start < n; start += batch_size) {
    idx.resize(std::min(batch_size, n - start));
    std::iota(idx.begin(), idx.end(), start);
    const engine::Batch batch = conv.Convert(rows, idx);
    const bool ctr = !batch.ctr_labels.empty();
    absl::StatusOr<std::vector<double>> z = model.Predict(batch, ctr ? engine::Head::kCtr : engine::Head::kCvr);
    if (!z.ok()) return z.status();
    logits.insert(logits.end(), z->begin(), z->end());
    const std::vector<float>& l = ctr ? batch.ctr_labels : batch.cvr_labels;
    labels.insert(labels.end(), l.begin(), l.end());
  }
  return engine::ComputeBinaryMetrics(logits, labels);
}

// Everything one attempt at a rank holds.
class RankRun {
 public:
  RankRun(const v1::Assignment& a, TaskControl& control, const TrainingOptions& options,
          v1::WorkerService::StubInterface* stub, std::shared_ptr<v1::WorkerService::StubInterface> shared_stub,
          WorkerMetrics* metrics)
      : a_(a),
        spec_(a.spec()),
        control_(control),
        options_(options),
        shared_stub_(std::move(shared_stub)),
        metrics_(metrics),
        reporter_(stub, a, control.worker_id(), options.auth_token) {}

  ~RankRun() {
    if (sample_log_ != nullptr) std::fclose(sample_log_);
  }

  absl::Status Run();

 private:
  absl::Status Setup();
  absl::Status Connect();
  absl::StatusOr<int64_t> AgreeOnResumeStep();
  absl::Status Restore(int64_t step);
  absl::Status Step(int64_t step);
  absl::Status SyncAndApply(StepTimes* times);
  absl::Status Checkpoint(int64_t step);
  absl::Status EvaluateAndReport(int64_t step);
  void LogSamples(int64_t step, const data::Batch& source, const std::vector<int64_t>& rows);
  std::string Describe() const { return absl::StrCat(a_.job(), " rank ", a_.rank(), "/", a_.world_size()); }

  const v1::Assignment& a_;
  const v1::JobSpec& spec_;
  TaskControl& control_;
  const TrainingOptions& options_;
  std::shared_ptr<v1::WorkerService::StubInterface> shared_stub_;
  WorkerMetrics* metrics_;
  Reporter reporter_;

  JobModel job_model_;
  std::unique_ptr<RankData> train_;
  std::optional<data::Batch> eval_rows_;
  std::optional<BatchConverter> converter_;
  std::unique_ptr<engine::GemLite<float>> model_;
  ParameterLayout layout_;
  std::shared_ptr<comm::Communicator> comm_;  // Null when world_size == 1.
  std::string checkpoint_dir_;
  std::FILE* sample_log_ = nullptr;
  int64_t samples_done_ = 0;
  double loss_sum_ = 0;
  int64_t loss_steps_ = 0;
  // Scratch buffers for the per-step all-reduces.
  std::vector<float> grads_, tables_before_, tables_delta_;
  std::vector<TensorView> table_views_;
};

absl::Status RankRun::Setup() {
  absl::StatusOr<JobModel> jm = JobModelFromSpec(spec_);
  if (!jm.ok()) return jm.status();
  job_model_ = std::move(*jm);
  absl::StatusOr<DataFiles> files = ResolveData(spec_.data());
  if (!files.ok()) return files.status();
  absl::StatusOr<std::unique_ptr<RankData>> train =
      OpenRankData(a_.loader_address(), files->train, a_.rank(), a_.world_size(), spec_.data().local_batch_size(),
                   spec_.training().seed());
  if (!train.ok()) return train.status();
  train_ = std::move(*train);
  absl::StatusOr<BatchConverter> conv = BatchConverter::Create(job_model_, train_->schema());
  if (!conv.ok()) return conv.status();
  converter_.emplace(std::move(*conv));
  if (!files->eval.empty() && a_.rank() == 0) {
    absl::StatusOr<data::Batch> eval = data::ReadAll(files->eval);
    if (!eval.ok()) return eval.status();
    if (!(eval->schema() == train_->schema())) {
      return absl::FailedPreconditionError(
          absl::StrCat(files->eval, " has another schema than the training data"));
    }
    eval_rows_ = std::move(*eval);
  }
  absl::StatusOr<std::unique_ptr<engine::GemLite<float>>> model =
      engine::GemLite<float>::Create(job_model_.config, job_model_.schema);
  if (!model.ok()) return model.status();
  model_ = std::move(*model);
  layout_ = LayoutOf(*model_);
  table_views_.assign(layout_.views.begin() + layout_.dense_grads.size(), layout_.views.end());
  checkpoint_dir_ = spec_.training().checkpoint_dir().empty()
                        ? absl::StrCat(options_.checkpoint_root, "/", JobId(a_.job()))
                        : StripScheme(spec_.training().checkpoint_dir());
  if (!options_.sample_log_dir.empty()) {
    const std::string path = absl::StrFormat("%s/%s.rank-%d.epoch-%d.log", options_.sample_log_dir, JobId(a_.job()),
                                             a_.rank(), a_.restart_epoch());
    sample_log_ = std::fopen(path.c_str(), "a");
    if (sample_log_ == nullptr) return absl::InternalError(absl::StrCat("cannot open sample log ", path));
  }
  return absl::OkStatus();
}

absl::Status RankRun::Connect() {
  if (a_.world_size() == 1) return absl::OkStatus();
  comm::GrpcKvStore store(shared_stub_, a_.job(), a_.restart_epoch(), absl::Seconds(10), options_.auth_token);
  absl::StatusOr<std::shared_ptr<comm::GlooTransport>> transport = comm::GlooTransport::Create(options_.gloo_host);
  if (!transport.ok()) return transport.status();
  comm::CommOptions comm_options;
  comm_options.timeout = options_.comm_timeout;
  absl::StatusOr<std::unique_ptr<comm::Communicator>> comm =
      comm::ConnectGloo(store, a_.rank(), a_.world_size(), *transport, comm_options);
  if (!comm.ok()) return comm.status();
  comm_ = std::move(*comm);
  std::shared_ptr<comm::Communicator> c = comm_;
  control_.OnStop([c] { c->Abort("task stopped by the worker (abort or shutdown)"); });
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
    absl::StatusOr<std::optional<int64_t>> latest = LatestCompleteCheckpoint(checkpoint_dir_, a_.world_size());
    if (!latest.ok()) return latest.status();
    step = latest->value_or(0);
    if (step != a_.resume_step()) {
      std::fprintf(stderr, "worker: %s: assignment says resume at step %lld, newest complete checkpoint is %lld\n",
                   Describe().c_str(), static_cast<long long>(a_.resume_step()), static_cast<long long>(step));
    }
  }
  if (comm_ != nullptr) {
    if (absl::Status s = comm_->Broadcast(MakeView(&step, DType::kInt64, {1}), 0); !s.ok()) return s;
  }
  return step;
}

absl::Status RankRun::Restore(int64_t step) {
  std::vector<float> flat(layout_.total_numel);
  for (int r = 0; r < a_.world_size(); ++r) {
    absl::StatusOr<CheckpointShard> shard = ReadCheckpointShard(checkpoint_dir_, step, r, a_.world_size());
    if (!shard.ok()) return shard.status();
    if ((*shard)["layout"] != layout_.Fingerprint()) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint step ", step, " in ", checkpoint_dir_,
                                                        " holds another model's parameters"));
    }
    const auto [begin, end] = ShardRange(layout_.total_numel, r, a_.world_size());
    const std::string& values = (*shard)["params"];
    if (values.size() != static_cast<size_t>(end - begin) * sizeof(float)) {
      return absl::DataLossError(absl::StrCat("checkpoint step ", step, " shard ", r, " has ", values.size(),
                                              " parameter bytes, expected ", (end - begin) * sizeof(float)));
    }
    std::memcpy(flat.data() + begin, values.data(), values.size());
    if (r == a_.rank() && !absl::SimpleAtoi((*shard)["samples"], &samples_done_)) {
      return absl::DataLossError(absl::StrCat("checkpoint step ", step, " shard ", r, " has no sample count"));
    }
  }
  Scatter(flat, layout_.views);
  std::fprintf(stderr, "worker: %s resumed from checkpoint step %lld in %s\n", Describe().c_str(),
               static_cast<long long>(step), checkpoint_dir_.c_str());
  return absl::OkStatus();
}

absl::Status RankRun::Checkpoint(int64_t step) {
  const Clock::time_point start = Clock::now();
  std::vector<float> flat(layout_.total_numel);
  Gather(layout_.views, &flat);
  const auto [begin, end] = ShardRange(layout_.total_numel, a_.rank(), a_.world_size());
  CheckpointShard shard;
  shard["layout"] = layout_.Fingerprint();
  shard["params"].assign(reinterpret_cast<const char*>(flat.data() + begin), (end - begin) * sizeof(float));
  shard["samples"] = absl::StrCat(samples_done_);
  shard["step"] = absl::StrCat(step);
  if (absl::Status s = WriteCheckpointShard(checkpoint_dir_, step, a_.rank(), a_.world_size(), shard); !s.ok()) {
    return s;
  }
  if (comm_ != nullptr) {
    if (absl::Status s = comm_->Barrier(); !s.ok()) return s;
  }
  if (a_.rank() == 0) {
    if (absl::Status s = CommitCheckpoint(checkpoint_dir_, step, a_.world_size()); !s.ok()) return s;
    if (absl::Status s = PruneCheckpoints(checkpoint_dir_, a_.world_size(), options_.keep_checkpoints); !s.ok()) {
      return s;
    }
  }
  metrics_->RecordCheckpoint(Since(start));
  return absl::OkStatus();
}

absl::Status RankRun::SyncAndApply(StepTimes* times) {
  if (comm_ == nullptr) {
    Clock::time_point t = Clock::now();
    absl::Status s = model_->ApplyUpdates();
    times->compute_seconds += Since(t);
    return s;
  }
  // Dense gradients: one averaging all-reduce over the flattened gradients.
  Clock::time_point t = Clock::now();
  grads_.resize(layout_.dense_numel);
  Gather(layout_.dense_grads, &grads_);
  tables_before_.resize(layout_.total_numel - layout_.dense_numel);
  Gather(table_views_, &tables_before_);
  times->compute_seconds += Since(t);
  t = Clock::now();
  if (absl::Status s = comm_->AllReduce(MakeView(grads_.data(), DType::kFloat32, {layout_.dense_numel}),
                                        comm::ReduceOp::kAvg);
      !s.ok()) {
    return s;
  }
  times->comm_seconds += Since(t);
  t = Clock::now();
  Scatter(grads_, layout_.dense_grads);
  if (absl::Status s = model_->ApplyUpdates(); !s.ok()) return s;
  // Tables: average every rank's local rowwise-Adagrad update.
  tables_delta_.resize(tables_before_.size());
  Gather(table_views_, &tables_delta_);
  for (size_t i = 0; i < tables_delta_.size(); ++i) tables_delta_[i] -= tables_before_[i];
  times->compute_seconds += Since(t);
  t = Clock::now();
  if (absl::Status s = comm_->AllReduce(
          MakeView(tables_delta_.data(), DType::kFloat32, {static_cast<int64_t>(tables_delta_.size())}),
          comm::ReduceOp::kAvg);
      !s.ok()) {
    return s;
  }
  times->comm_seconds += Since(t);
  t = Clock::now();
  for (size_t i = 0; i < tables_delta_.size(); ++i) tables_delta_[i] += tables_before_[i];
  Scatter(tables_delta_, table_views_);
  times->compute_seconds += Since(t);
  return absl::OkStatus();
}

void RankRun::LogSamples(int64_t step, const data::Batch& source, const std::vector<int64_t>& rows) {
  if (sample_log_ == nullptr) return;
  std::string line = absl::StrCat(step);
  for (int64_t row : rows) {
    const int64_t id = converter_->SampleId(source, row);
    absl::StrAppend(&line, " ", id >= 0 ? id : row);
  }
  line += "\n";
  std::fwrite(line.data(), 1, line.size(), sample_log_);
  // Into the kernel at once: a SIGKILL right after must not lose the line.
  std::fflush(sample_log_);
}

absl::Status RankRun::Step(int64_t step) {
  StepTimes times;
  const Clock::time_point start = Clock::now();
  std::vector<int64_t> rows;
  absl::StatusOr<const data::Batch*> source = train_->Step(step, &rows);
  if (!source.ok()) return source.status();
  const engine::Batch batch = converter_->Convert(**source, rows);
  times.data_wait_seconds = Since(start);
  Clock::time_point t = Clock::now();
  absl::StatusOr<engine::StepResult> result = model_->ForwardBackward(batch);
  if (!result.ok()) return result.status();
  times.compute_seconds = Since(t);
  if (absl::Status s = SyncAndApply(&times); !s.ok()) return s;
  times.step_seconds = Since(start);
  LogSamples(step, **source, rows);
  samples_done_ += batch.size;
  const double loss = result->ctr_loss + result->cvr_loss;
  loss_sum_ += loss;
  ++loss_steps_;
  metrics_->RecordStep(step, batch.size, result->flops, loss, times);
  v1::StepStats stats;
  stats.set_step(step);
  stats.set_samples(batch.size);
  stats.set_step_seconds(times.step_seconds);
  stats.set_data_wait_seconds(times.data_wait_seconds);
  stats.set_compute_seconds(times.compute_seconds);
  stats.set_comm_seconds(times.comm_seconds);
  stats.set_loss(loss);
  reporter_.AddStep(stats);
  if (options_.log_every > 0 && step % options_.log_every == 0) {
    std::fprintf(stderr,
                 "worker: %s step %lld/%lld loss %.4f | %.0f samples/s, %.2f useful GFLOP/s | step %.1f ms "
                 "(data %.1f, compute %.1f, comm %.1f)\n",
                 Describe().c_str(), static_cast<long long>(step), static_cast<long long>(spec_.training().steps()),
                 loss_sum_ / loss_steps_, metrics_->samples_per_second(), metrics_->useful_tflops() * 1e3,
                 times.step_seconds * 1e3, times.data_wait_seconds * 1e3, times.compute_seconds * 1e3,
                 times.comm_seconds * 1e3);
    loss_sum_ = 0;
    loss_steps_ = 0;
  }
  return reporter_.Flush(/*force=*/false);
}

absl::Status RankRun::EvaluateAndReport(int64_t step) {
  // Rank 0 evaluates the (identical) replica on the whole eval set; the
  // others wait at their next collective.
  if (a_.rank() != 0 || !eval_rows_.has_value()) return absl::OkStatus();
  const int64_t bs = spec_.data().eval_batch_size() > 0 ? spec_.data().eval_batch_size() : 1024;
  absl::StatusOr<engine::BinaryMetrics> m = Evaluate(*model_, *converter_, *eval_rows_, bs);
  if (!m.ok()) return m.status();
  metrics_->RecordEval(m->auc, m->normalized_entropy);
  v1::EvalStats eval;
  eval.set_step(step);
  eval.set_auc(m->auc);
  eval.set_ne(m->normalized_entropy);
  reporter_.SetEval(eval);
  std::fprintf(stderr, "worker: %s eval at step %lld: AUC %.4f NE %.4f log loss %.4f (%lld samples)\n",
               Describe().c_str(), static_cast<long long>(step), m->auc, m->normalized_entropy, m->log_loss,
               static_cast<long long>(m->count));
  return reporter_.Flush(/*force=*/true);
}

absl::Status RankRun::Run() {
  metrics_->StartTask(a_.job(), a_.rank(), a_.world_size());
  if (absl::Status s = Setup(); !s.ok()) return s;
  if (absl::Status s = Connect(); !s.ok()) return s;
  absl::StatusOr<int64_t> resume = AgreeOnResumeStep();
  if (!resume.ok()) return resume.status();
  if (*resume > 0) {
    if (absl::Status s = Restore(*resume); !s.ok()) return s;
  }
  control_.SetRunning();
  const int64_t steps = spec_.training().steps();
  const int64_t ckpt_every = spec_.training().checkpoint_every();
  const int64_t eval_every = spec_.training().eval_every();
  std::fprintf(stderr, "worker: %s training steps %lld..%lld, %lld samples per rank-step, checkpoints in %s\n",
               Describe().c_str(), static_cast<long long>(*resume + 1), static_cast<long long>(steps),
               static_cast<long long>(spec_.data().local_batch_size()), checkpoint_dir_.c_str());
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
  return reporter_.Flush(/*force=*/true);
}

}  // namespace

TrainingTask::TrainingTask(std::shared_ptr<v1::WorkerService::StubInterface> stub, TrainingOptions options,
                           WorkerMetrics* metrics)
    : stub_(std::move(stub)), options_(std::move(options)), metrics_(metrics) {}

absl::Status TrainingTask::Run(const v1::Assignment& assignment, TaskControl& control) {
  RankRun run(assignment, control, options_, stub_.get(), stub_, metrics_);
  absl::Status s = run.Run();
  if (!s.ok() && control.stop_requested()) {
    return absl::CancelledError(absl::StrCat("stopped: ", s.message()));
  }
  return s;
}

}  // namespace recfleet::worker
