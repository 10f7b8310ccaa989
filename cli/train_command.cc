// `recfleet train --local JOB.yaml`: trains a job in this process with the
// worker's own step code (worker/rank_run.h) and a world of one: the same
// JobSpec files `recfleet submit` takes, the same `.rfd` datasets, the same
// loader dealing (BBS included) and checkpoints. Prints progress, the eval
// AUC / NE and the item-popularity baseline on the same split. With
// `--device cuda` the same step code trains on the GPU engine
// (worker/single_rank_model.h): same spec, same dealt batches, checkpoints
// and evals, the same path as `recfleet-worker --device cuda`.

#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "services/common/log.h"
#include "cli/jobs/spec_file.h"
#include "data/dataset_file.h"
#include "data/synth.h"
#include "engine/job_model.h"
#include "engine/metrics.h"
#include "engine/model.h"
#include "worker/rank_data.h"
#include "services/coordinator/plan_adapter.h"
#include "services/coordinator/spec_validation.h"
#include "services/dataloader/job_loader.h"
#include "worker/comm/kv_store.h"
#include "worker/rank_run.h"

namespace recfleet::cli {
namespace {

constexpr char kUsage[] =
    "usage: recfleet train --local JOB.yaml [--dataset LOCATION] [--steps N] [--checkpoint-dir DIR]\n"
    "                      [--data-root DIR] [--log-every N] [--device cpu|cuda]\n"
    "                      [--precision fp32|bf16]\n"
    "\n"
    "Trains the job in this process with the worker's step code and a world of one (the job's\n"
    "resources and parallelism are for clusters and are not used here) and prints progress, the\n"
    "eval AUC / NE and the item-popularity baseline on the same eval set.\n"
    "  --local JOB.yaml     a JobSpec file, as `recfleet submit` takes (deploy/examples/)\n"
    "  --dataset LOCATION   override spec.data.dataset (.rfd file, directory or synthetic://...)\n"
    "  --steps N            override spec.training.steps\n"
    "  --checkpoint-dir D   where checkpoints go (default: spec.training.checkpoint_dir, else a\n"
    "                       fresh temporary directory)\n"
    "  --data-root DIR      relative dataset paths are taken from here, and no dataset outside it\n"
    "                       is read (default: the working directory, any path)\n"
    "  --log-every N        progress line every N steps (default: steps / 20)\n"
    "  --device D           cpu (the CPU reference engine, default) or cuda (the GPU engine, CUDA\n"
    "                       device 0)\n"
    "  --precision P        cuda only: bf16 (default; bf16 GEMMs and attention, fp32 master\n"
    "                       weights) or fp32";

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "recfleet train: %s\n", message.c_str());
  return code;
}

int ExitCodeOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
      return kExitNotFound;
    case absl::StatusCode::kInvalidArgument:
      return kExitUsage;
    default:
      return kExitFailure;
  }
}

// Prints each evaluation, counts the samples trained and keeps the last evaluation.
class PrintingSink : public worker::ProgressSink {
 public:
  void ReportStep(const v1::StepStats& s) override { samples_ += s.samples(); }
  void ReportEval(const v1::EvalStats& e) override {
    eval_ = e;
    std::printf("eval at step %lld: AUC %.4f NE %.4f\n", static_cast<long long>(e.step()), e.auc(), e.ne());
    std::fflush(stdout);
  }
  absl::Status Flush(bool) override { return absl::OkStatus(); }
  const v1::EvalStats& eval() const { return eval_; }
  int64_t samples() const { return samples_; }

 private:
  int64_t samples_ = 0;
  v1::EvalStats eval_;
};

// AUC on the eval set of the candidate item's smoothed positive rate in the
// training set (10 pseudo-samples at the global rate): the count baseline
// any model should beat. Returns -1 when the data has no such columns.
double ItemPopularityAuc(const engine::JobModel& model, const v1::JobSpec& spec, const std::string& train_file,
                         const std::string& eval_file) {
  std::string item_column;
  for (const v1::Feature& f : spec.model().features()) {
    if (f.kind() == v1::Feature::CANDIDATE) {
      item_column = f.name();
      break;
    }
  }
  const std::string& label = !model.ctr_label.empty() ? model.ctr_label : model.cvr_label;
  absl::StatusOr<data::Batch> train = data::ReadAll(train_file);
  absl::StatusOr<data::Batch> eval = data::ReadAll(eval_file);
  if (item_column.empty() || !train.ok() || !eval.ok()) return -1;
  auto columns = [&](const data::Batch& b, int* item, int* y) {
    *item = b.schema().Find(item_column);
    *y = b.schema().Find(label);
    return *item >= 0 && *y >= 0 && b.schema().features[*item].layout == data::Layout::kScalar &&
           b.schema().features[*item].dtype == data::DType::kInt64;
  };
  auto label_of = [](const data::Batch& b, int c, int64_t row) {
    return b.schema().features[c].dtype == data::DType::kFloat32 ? b.Float(c, row)
                                                                 : static_cast<float>(b.Int64(c, row));
  };
  int item = -1, y = -1;
  if (!columns(*train, &item, &y)) return -1;
  std::map<int64_t, std::pair<double, double>> stats;  // item -> (positives, samples)
  double positives = 0;
  for (size_t r = 0; r < train->num_rows(); ++r) {
    const double l = label_of(*train, y, r) > 0.5 ? 1 : 0;
    auto& s = stats[train->Int64(item, r)];
    s.first += l;
    s.second += 1;
    positives += l;
  }
  const double prior = positives / std::max<double>(1, train->num_rows());
  if (!columns(*eval, &item, &y)) return -1;
  std::vector<double> scores;
  std::vector<float> labels;
  for (size_t r = 0; r < eval->num_rows(); ++r) {
    auto it = stats.find(eval->Int64(item, r));
    const double pos = it == stats.end() ? 0 : it->second.first;
    const double n = it == stats.end() ? 0 : it->second.second;
    scores.push_back((pos + 10 * prior) / (n + 10));
    labels.push_back(label_of(*eval, y, r) > 0.5 ? 1.0f : 0.0f);
  }
  return data::Auc(scores, labels);
}

int Run(const std::vector<std::string>& args) {
  absl::StatusOr<Flags> flags = ParseCommandFlags(
      "train", args, {"local", "dataset", "checkpoint-dir", "data-root", "steps", "log-every", "device", "precision"});
  if (!flags.ok()) return kExitUsage;
  // The worker's step code logs its progress through spdlog: to stderr, with
  // time and level, apart from this command's own lines on stdout.
  InitLogging("recfleet-train");
  const std::string job_path = flags->Str("local"), dataset = flags->Str("dataset");
  const std::string checkpoint_dir = flags->Str("checkpoint-dir"), data_root = flags->Str("data-root");
  const std::string device = flags->Str("device", "cpu"), precision = flags->Str("precision");
  int64_t steps = -1, log_every = -1;
  if (!flags->Get("steps", &steps).ok() || (flags->Has("steps") && steps < 1)) {
    return Fail("--steps needs an integer >= 1", kExitUsage);
  }
  if (!flags->Get("log-every", &log_every).ok() || (flags->Has("log-every") && log_every < 0)) {
    return Fail("--log-every needs an integer >= 0", kExitUsage);
  }
  if (device != "cpu" && device != "cuda") return Fail("--device is cpu or cuda", kExitUsage);
  if (!precision.empty() && precision != "fp32" && precision != "bf16") {
    return Fail("--precision is fp32 or bf16", kExitUsage);
  }
  if (job_path.empty()) return Fail(absl::StrFormat("pass --local JOB.yaml\n%s", kUsage), kExitUsage);
  if (device == "cpu" && !precision.empty()) {
    return Fail("--precision applies to --device cuda only (the CPU engine computes in fp32)", kExitUsage);
  }
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpec(job_path);
  if (!spec.ok()) return Fail(std::string(spec.status().message()), ExitCodeOf(spec.status()));
  if (!dataset.empty()) spec->mutable_data()->set_dataset(dataset);
  if (steps > 0) spec->mutable_training()->set_steps(steps);
  // A world of one: the cluster sections do not apply to this run, and
  // --device decides whether it is a GPU job (what the GPU-only fields of
  // model.precision need: FP8 modules, FP8 attention, the quality gate).
  spec->mutable_resources()->set_workers(1);
  spec->mutable_resources()->set_gpus_per_worker(device == "cuda" ? 1 : 0);
  spec->clear_parallelism();
  auto check = [](const v1::JobSpec& job) {
    absl::Status s = coordinator::ValidateJobSpec(job);
    return s.ok() ? engine::CheckBuildable(job) : s;
  };
  if (absl::Status s = check(*spec); !s.ok()) {
    std::string message(s.message());
    v1::JobSpec on_gpu = *spec;
    on_gpu.mutable_resources()->set_gpus_per_worker(1);
    if (device == "cpu" && check(on_gpu).ok()) {
      absl::StrAppend(&message, " (recfleet train --local runs it as a GPU job with --device cuda)");
    }
    return Fail(message, kExitUsage);
  }

  const std::string name = absl::StrCat("local/", spec->display_name().empty() ? "job" : spec->display_name());
  v1::Assignment a;
  a.set_job(name);
  *a.mutable_spec() = *spec;
  a.set_rank(0);
  a.set_world_size(1);
  a.set_restart_epoch(1);
  if (spec->model().activation_memory().budget_bytes() > 0) {
    // The planner chooses the blocks to recompute, as for a cluster job.
    absl::StatusOr<v1::Plan> plan = coordinator::PlanOneGpu(*spec, coordinator::DefaultHardware());
    if (!plan.ok()) return Fail(std::string(plan.status().message()), ExitCodeOf(plan.status()));
    *a.mutable_plan() = *std::move(plan);
  }
  absl::StatusOr<v1::DataConfig> data = engine::BuildDataConfig(*spec, name, 1);
  if (!data.ok()) return Fail(std::string(data.status().message()), kExitUsage);
  *a.mutable_data() = *data;

  worker::TrainingOptions options;
  options.datasets.root = data_root;
  if (device == "cuda") {
    options.device = Device::kCuda;
    options.bf16 = precision != "fp32";
  }
  if (!checkpoint_dir.empty()) {
    a.mutable_spec()->mutable_training()->set_checkpoint_dir(checkpoint_dir);
  } else if (spec->training().checkpoint_dir().empty()) {
    char tmpl[] = "/tmp/recfleet-train-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return Fail("cannot create a checkpoint directory under /tmp", kExitFailure);
    a.mutable_spec()->mutable_training()->set_checkpoint_dir(tmpl);
  }
  const int64_t total = a.spec().training().steps();
  options.log_every = log_every >= 0 ? log_every : std::max<int64_t>(1, total / 20);
  std::printf("training %s locally on %s: %lld steps of %d samples, checkpoints in %s\n", name.c_str(),
              device.c_str(), static_cast<long long>(total), spec->data().local_batch_size(),
              a.spec().training().checkpoint_dir().c_str());
  std::fflush(stdout);

  worker::TaskControl control("local");
  comm::InProcessKvStore store;
  PrintingSink sink;
  worker::WorkerMetrics metrics;
  if (absl::Status s = worker::RunRank(a, control, store, sink, options, &metrics); !s.ok()) {
    return Fail(std::string(s.message()), ExitCodeOf(s));
  }

  std::printf("\nresult (%lld samples trained):\n", static_cast<long long>(sink.samples()));
  absl::StatusOr<engine::JobModel> model = engine::BuildJobModel(*spec);
  absl::StatusOr<dataloader::DatasetFiles> files = dataloader::ResolveDataset(spec->data().dataset(), options.datasets);
  const std::string eval_file =
      dataloader::ResolveEvalFile(spec->data().dataset(), spec->data().eval_dataset(), options.datasets)
          .value_or("");
  if (eval_file.empty() || sink.eval().step() == 0) {
    std::printf("  no eval set (spec.data.eval_dataset, or eval.rfd beside the training data)\n");
    return kExitOk;
  }
  const double popularity = model.ok() && files.ok() ? ItemPopularityAuc(*model, *spec, files->train, eval_file) : -1;
  if (popularity >= 0) std::printf("  item popularity  AUC %.4f\n", popularity);
  std::printf("  model            AUC %.4f  NE %.4f  (step %lld)\n", sink.eval().auc(), sink.eval().ne(),
              static_cast<long long>(sink.eval().step()));
  return kExitOk;
}

RECFLEET_REGISTER_COMMAND({
    "train",
    "Train a job locally in this process (--local JOB.yaml)",
    kUsage,
    Run,
});

}  // namespace
}  // namespace recfleet::cli
