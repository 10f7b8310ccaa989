#ifndef RECFLEET_ENGINE_LOCAL_JOB_H_
#define RECFLEET_ENGINE_LOCAL_JOB_H_

// A local training job: which dataset, the GEM-lite config, trainer
// options; parsed from YAML (what `recfleet train --local job.yaml` reads)
// and run in-process. The YAML layout mirrors the job spec: sections
// `dataset`, `model`, `train`; every key is optional and unknown keys are
// errors. See engine/examples/*.yaml for every key with its default.

#include <string>

#include "absl/status/statusor.h"
#include "engine/metrics.h"
#include "engine/model_config.h"
#include "engine/movielens.h"
#include "engine/synthetic.h"
#include "engine/trainer.h"

namespace recfleet::engine {

struct DatasetSpec {
  // "movielens": atomic files under `path`; "synthetic": SyntheticMovieLens.
  std::string format = "movielens";
  std::string path;
  CtrOptions ctr;
  SyntheticOptions synthetic;
};

struct LocalJob {
  DatasetSpec dataset;
  GemLiteConfig model;
  TrainerOptions train;
};

// InvalidArgument names the offending key (e.g. "model.seq_mask") and the
// expected form.
absl::StatusOr<LocalJob> ParseLocalJob(const std::string& yaml_text);
// Reads the file; a relative dataset.path that does not exist from the
// working directory is tried relative to the file's folder.
absl::StatusOr<LocalJob> LoadLocalJob(const std::string& path);

struct LocalRunResult {
  BaselineAucs baselines;
  TrainReport report;
  int64_t train_samples = 0;
  int64_t eval_samples = 0;
  int64_t dense_parameters = 0;
  int64_t table_parameters = 0;
};

// Builds the dataset and model, prints (through `log`) the baselines,
// progress and per-epoch evaluation, and returns the numbers.
absl::StatusOr<LocalRunResult> RunLocalJob(const LocalJob& job, const Trainer::Logger& log);

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_LOCAL_JOB_H_
