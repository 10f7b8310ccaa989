#ifndef RECFLEET_SERVICES_DATALOADER_JOB_LOADER_H_
#define RECFLEET_SERVICES_DATALOADER_JOB_LOADER_H_

// A job's data, opened from its DataConfig (dataloader.proto): where the
// dataset lives, and the epoch loader (data/loader.h) dealing it to the
// job's ranks. Used by the DataLoader service (one JobLoader per job it
// serves, shared by the job's rank streams) and in-process by workers that
// read their data themselves and by `recfleet train --local`, so a job's
// batches are the same whichever way they are read.
//
// Dataset locations: a .rfd file, a directory holding train.rfd (and
// eval.rfd), either optionally prefixed "file://"; relative paths are taken
// from DatasetOptions::root. "synthetic://NAME?k=v&..." names data made by
// data/synth.h (keys: samples, users, items, clusters, dense, zipf, lengths,
// eval_fraction, seed); it is generated once into DatasetOptions::cache_dir
// and then read like a directory.

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "data/loader.h"
#include "data/synth.h"
#include "recfleet/v1/dataloader.pb.h"

namespace recfleet::dataloader {

struct DatasetOptions {
  // Relative dataset paths are taken from here ("" = the working directory).
  // When set, a plain or file:// location must also lie inside it
  // (CheckDatasetUnderRoot): a job cannot name files elsewhere.
  std::string root;
  // Where synthetic:// datasets are generated ("" = $TMPDIR or /tmp, in
  // recfleet-synthetic/).
  std::string cache_dir;
};

// The training and evaluation files of a dataset location.
struct DatasetFiles {
  std::string train;
  std::string eval;  // "" when the location has no eval.rfd.
};

// The generator options a "synthetic://NAME?k=v&..." location names (keys
// as above; defaults for keys it leaves out). InvalidArgument naming the key
// for an unknown key or a bad value. Also read by benchmarks that draw
// batches of a job's data shape without writing a dataset.
absl::StatusOr<data::SynthOptions> ParseSyntheticDataset(const std::string& location);

// The path a plain or file:// dataset location names, made absolute under
// `root` when relative ("" = the working directory); a location of another
// scheme (synthetic://...) or "" as it is. The rule ResolveDataset applies.
std::string DatasetPath(const std::string& location, const std::string& root);

// OK when a job may read `location` on a process whose data root is `root`:
// a synthetic:// URI (or another scheme, which ResolveDataset rejects), any
// location when `root` is "" (a process without a
// data root reads what its user can), else a plain or file:// path that,
// resolved by DatasetPath and normalized ("." and ".." taken lexically, the
// working directory for relative paths), is `root` or lies below it.
// InvalidArgument otherwise, decided without looking at the file system, so
// the answer says nothing about what exists outside the root. Symbolic links
// inside the root are followed: they are the operator's.
absl::Status CheckDatasetUnderRoot(const std::string& location, const std::string& root);

// NotFound naming the path when nothing is there; InvalidArgument for a
// malformed synthetic:// URI or a path outside options.root
// (CheckDatasetUnderRoot).
absl::StatusOr<DatasetFiles> ResolveDataset(const std::string& location, const DatasetOptions& options);

// The evaluation file of a job: spec.data.eval_dataset's eval.rfd (or the
// file it names), else the eval.rfd beside the training data; "" when there
// is none. Errors only for an eval_dataset that cannot be found.
absl::StatusOr<std::string> ResolveEvalFile(const std::string& dataset, const std::string& eval_dataset,
                                            const DatasetOptions& options);

// The epoch loader's options for `config` over `train_file`.
// InvalidArgument naming the DataConfig field for inconsistent settings.
absl::StatusOr<data::LoaderOptions> LoaderOptionsFor(const v1::DataConfig& config, const std::string& train_file);

// One job's open loader and its dealt steps, shared by the job's ranks.
// Thread-safe.
class JobLoader {
 public:
  static absl::StatusOr<std::shared_ptr<JobLoader>> Open(const v1::DataConfig& config,
                                                         const DatasetOptions& options);

  const v1::DataConfig& config() const { return config_; }
  const std::string& eval_file() const { return eval_file_; }
  const std::shared_ptr<const data::Schema>& schema() const { return schema_; }
  const v1::LoaderInfo& info() const { return info_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }

  // The plan of (epoch, step), computed or taken from a small cache that
  // keeps it until every rank has asked for it (an evicted plan is
  // recomputed identically: the loader is deterministic). `first_time` is
  // set when this call computed the step for the first time.
  absl::StatusOr<std::shared_ptr<const data::StepPlan>> TakePlan(int64_t epoch, int64_t step, int rank,
                                                                 bool* first_time = nullptr);

 private:
  JobLoader() = default;

  v1::DataConfig config_;
  std::string eval_file_;
  std::shared_ptr<const data::Schema> schema_;
  v1::LoaderInfo info_;
  int64_t steps_per_epoch_ = 0;
  // Dealt steps kept for ranks that have not taken them yet: enough for
  // every rank's stream to prefetch several steps ahead of the slowest.
  static constexpr size_t kCacheCapacity = 16;

  absl::Mutex mu_;
  std::unique_ptr<data::Loader> loader_ ABSL_GUARDED_BY(mu_);
  struct CachedPlan {
    std::pair<int64_t, int64_t> key;  // (epoch, step)
    std::shared_ptr<const data::StepPlan> plan;
    std::vector<bool> taken;  // Per rank.
    int taken_count = 0;
  };
  std::list<CachedPlan> cache_ ABSL_GUARDED_BY(mu_);  // Most recent first.
  std::pair<int64_t, int64_t> last_first_ ABSL_GUARDED_BY(mu_) = {-1, -1};
};

// The jobs a loader serves: a job is opened on its first request and
// shared by every later request with the same DataConfig. A request naming
// the same job with another configuration is refused (FailedPrecondition),
// so two ranks of one job can never be dealt by different rules. Jobs
// unused for `idle_close` and read by no stream are closed when the next
// request comes, and `on_close` (when set) is told each closed job's name,
// outside the lock. Thread-safe.
class JobLoaders {
 public:
  explicit JobLoaders(DatasetOptions options, absl::Duration idle_close = absl::Minutes(30),
                      std::function<void(const std::string& job)> on_close = nullptr)
      : options_(std::move(options)), idle_close_(idle_close), on_close_(std::move(on_close)) {}

  absl::StatusOr<std::shared_ptr<JobLoader>> Get(const v1::DataConfig& config);
  int open_jobs();

 private:
  struct Entry {
    std::string key;  // The serialized DataConfig.
    std::shared_ptr<JobLoader> loader;
    absl::Time last_use;
  };
  const DatasetOptions options_;
  const absl::Duration idle_close_;
  const std::function<void(const std::string&)> on_close_;
  absl::Mutex mu_;
  std::map<std::string, Entry> jobs_ ABSL_GUARDED_BY(mu_);  // By job name.
};

}  // namespace recfleet::dataloader

#endif  // RECFLEET_SERVICES_DATALOADER_JOB_LOADER_H_
