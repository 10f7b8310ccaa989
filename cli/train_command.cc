// `recfleet train --local job.yaml`: trains GEM-lite in this process on the
// CPU reference kernels and prints progress and evaluation metrics.

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "cli/command.h"
#include "engine/local_job.h"

namespace recfleet::engine {
namespace {

constexpr char kUsage[] =
    "usage: recfleet train --local JOB.yaml [--data PATH] [--epochs N] [--time-budget SECONDS]\n"
    "                      [--max-steps N]\n"
    "\n"
    "Trains GEM-lite in-process (CPU reference kernels) on the job's dataset and prints\n"
    "progress, per-epoch eval AUC / NE / loss, and the dataset's two count baselines.\n"
    "  --local JOB.yaml     job file (dataset, model, train sections; see engine/examples/)\n"
    "  --data PATH          override dataset.path (a MovieLens atomic-file folder)\n"
    "  --epochs N           override train.epochs\n"
    "  --time-budget S      override train.time_budget_s (stop starting steps after S s)\n"
    "  --max-steps N        override train.max_steps";

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "recfleet train: %s\n", message.c_str());
  return code;
}

int Run(const std::vector<std::string>& args) {
  std::string job_path, data;
  int64_t epochs = 0, max_steps = -1;
  double budget = -1;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string* { return i + 1 < args.size() ? &args[++i] : nullptr; };
    const std::string* v = nullptr;
    if (a == "--local") {
      if ((v = value()) == nullptr) return Fail("--local needs a job file", cli::kExitUsage);
      job_path = *v;
    } else if (a == "--data") {
      if ((v = value()) == nullptr) return Fail("--data needs a path", cli::kExitUsage);
      data = *v;
    } else if (a == "--epochs") {
      if ((v = value()) == nullptr || !absl::SimpleAtoi(*v, &epochs) || epochs < 1) {
        return Fail("--epochs needs an integer >= 1", cli::kExitUsage);
      }
    } else if (a == "--time-budget") {
      if ((v = value()) == nullptr || !absl::SimpleAtod(*v, &budget) || budget < 0) {
        return Fail("--time-budget needs seconds >= 0", cli::kExitUsage);
      }
    } else if (a == "--max-steps") {
      if ((v = value()) == nullptr || !absl::SimpleAtoi(*v, &max_steps) || max_steps < 0) {
        return Fail("--max-steps needs an integer >= 0", cli::kExitUsage);
      }
    } else {
      return Fail(absl::StrFormat("unknown argument '%s'\n%s", a, kUsage), cli::kExitUsage);
    }
  }
  if (job_path.empty()) {
    return Fail(absl::StrFormat("only local training is available here: pass --local JOB.yaml\n%s", kUsage),
                cli::kExitUsage);
  }
  absl::StatusOr<LocalJob> job = LoadLocalJob(job_path);
  if (!job.ok()) {
    return Fail(std::string(job.status().message()), job.status().code() == absl::StatusCode::kNotFound
                                                          ? cli::kExitNotFound
                                                          : cli::kExitUsage);
  }
  if (!data.empty()) {
    job->dataset.format = "movielens";
    job->dataset.path = data;
  }
  if (epochs > 0) job->train.epochs = static_cast<int>(epochs);
  if (budget >= 0) job->train.time_budget_s = budget;
  if (max_steps >= 0) job->train.max_steps = max_steps;

  absl::StatusOr<LocalRunResult> result = RunLocalJob(*job, [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  });
  if (!result.ok()) {
    return Fail(std::string(result.status().message()),
                result.status().code() == absl::StatusCode::kNotFound ? cli::kExitNotFound
                                                                       : cli::kExitFailure);
  }
  const TrainReport& r = result->report;
  const EpochReport& best = r.final();
  std::printf(
      "\nresult (eval, %lld samples):\n"
      "  item popularity      AUC %.4f\n"
      "  user + item rate     AUC %.4f\n"
      "  GEM-lite             AUC %.4f  NE %.4f  loss %.4f\n"
      "  %lld steps, %lld samples, %.2f GFLOP (model FLOPs, real lengths), %.2f GFLOP/s in steps\n"
      "  wall %.1f s, process CPU %.1f s%s\n",
      static_cast<long long>(result->eval_samples), result->baselines.item_popularity,
      result->baselines.user_item_rate, best.eval.auc, best.eval.normalized_entropy,
      best.eval.log_loss, static_cast<long long>(r.steps), static_cast<long long>(r.samples),
      r.flops * 1e-9, r.train_wall_s > 0 ? r.flops / r.train_wall_s * 1e-9 : 0.0, r.wall_s, r.cpu_s,
      r.stopped_by_budget ? " (stopped by the time budget)" : "");
  return cli::kExitOk;
}

RECFLEET_REGISTER_COMMAND({
    "train",
    "train a model locally in this process (--local job.yaml)",
    kUsage,
    Run,
});

}  // namespace
}  // namespace recfleet::engine
