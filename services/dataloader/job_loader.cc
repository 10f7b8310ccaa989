#include "services/dataloader/job_loader.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "data/bbs.h"
#include "data/cost_model.h"
#include "data/synth.h"
#include "services/dataloader/convert.h"

namespace recfleet::dataloader {
namespace {

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string DefaultCacheDir() {
  const char* tmp = ::getenv("TMPDIR");
  return absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/recfleet-synthetic");
}

// FNV-1a: a name that is the same in every process (absl::Hash is seeded
// per process), so every opener of a synthetic:// dataset finds one copy.
uint64_t StableHash(absl::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

absl::Status Bad(const std::string& location, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("dataset '", location, "': ", what));
}

}  // namespace

absl::StatusOr<data::SynthOptions> ParseSyntheticDataset(const std::string& location) {
  if (!absl::StartsWith(location, "synthetic://")) return Bad(location, "not a synthetic://NAME?k=v&... location");
  data::SynthOptions o;
  const std::string rest = location.substr(std::string("synthetic://").size());
  const size_t q = rest.find('?');
  if (q == std::string::npos) return o;
  for (absl::string_view kv : absl::StrSplit(rest.substr(q + 1), '&', absl::SkipEmpty())) {
    const size_t eq = kv.find('=');
    if (eq == absl::string_view::npos) return Bad(location, absl::StrCat("expected key=value, got '", kv, "'"));
    const std::string key(kv.substr(0, eq));
    const std::string value(kv.substr(eq + 1));
    bool ok = true;
    int64_t n = 0;
    if (key == "samples") {
      ok = absl::SimpleAtoi(value, &o.samples) && o.samples > 0;
    } else if (key == "users") {
      ok = absl::SimpleAtoi(value, &o.num_users) && o.num_users > 0;
    } else if (key == "items") {
      ok = absl::SimpleAtoi(value, &o.num_items) && o.num_items > 0;
    } else if (key == "clusters") {
      ok = absl::SimpleAtoi(value, &n) && n > 0;
      o.clusters = static_cast<int>(n);
    } else if (key == "dense") {
      ok = absl::SimpleAtoi(value, &n) && n >= 0;
      o.dense_features = static_cast<int>(n);
    } else if (key == "zipf") {
      ok = absl::SimpleAtod(value, &o.zipf) && o.zipf > 0;
    } else if (key == "eval_fraction") {
      ok = absl::SimpleAtod(value, &o.eval_fraction) && o.eval_fraction >= 0 && o.eval_fraction < 1;
    } else if (key == "seed") {
      ok = absl::SimpleAtoi(value, &o.seed);
    } else if (key == "lengths") {
      absl::StatusOr<data::LengthDistribution> l = data::LengthDistribution::Parse(value);
      if (!l.ok()) return Bad(location, std::string(l.status().message()));
      o.lengths = *l;
    } else {
      return Bad(location, absl::StrCat("unknown key '", key,
                                        "' (samples, users, items, clusters, dense, zipf, lengths, eval_fraction, "
                                        "seed)"));
    }
    if (!ok) return Bad(location, absl::StrCat("bad value for ", key, ": '", value, "'"));
  }
  return o;
}

namespace {

// Generates a synthetic dataset once: into a private folder first, renamed
// into place, so concurrent openers never read a half-written dataset.
absl::StatusOr<std::string> MaterializeSynthetic(const std::string& location, const DatasetOptions& options) {
  absl::StatusOr<data::SynthOptions> synth = ParseSyntheticDataset(location);
  if (!synth.ok()) return synth.status();
  const std::string cache = options.cache_dir.empty() ? DefaultCacheDir() : options.cache_dir;
  const std::string dir = absl::StrCat(cache, "/", absl::Hex(StableHash(location), absl::kZeroPad16));
  if (Exists(dir + "/train.rfd")) return dir;
  ::mkdir(cache.c_str(), 0755);
  const std::string tmp = absl::StrCat(dir, ".tmp-", ::getpid(), "-", absl::Hex(reinterpret_cast<uintptr_t>(&synth)));
  if (absl::Status s = data::GenerateSynthetic(*synth, tmp); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("generating ", location, ": ", s.message()));
  }
  if (::rename(tmp.c_str(), dir.c_str()) != 0 && !Exists(dir + "/train.rfd")) {
    return absl::InternalError(absl::StrCat("cannot move generated ", tmp, " to ", dir));
  }
  if (Exists(tmp)) {  // Another opener won the race; its copy is identical.
    std::remove((tmp + "/train.rfd").c_str());
    std::remove((tmp + "/eval.rfd").c_str());
    ::rmdir(tmp.c_str());
  }
  return dir;
}

}  // namespace

std::string DatasetPath(const std::string& location, const std::string& root) {
  const bool file = absl::StartsWith(location, "file://");
  if (!file && absl::StrContains(location, "://")) return location;
  std::string path = file ? location.substr(7) : location;
  if (!root.empty() && !path.empty() && path[0] != '/') path = absl::StrCat(root, "/", path);
  return path;
}

absl::Status CheckDatasetUnderRoot(const std::string& location, const std::string& root) {
  // synthetic:// data is generated, not read; ResolveDataset rejects other schemes.
  if (root.empty() || (absl::StrContains(location, "://") && !absl::StartsWith(location, "file://"))) {
    return absl::OkStatus();
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path base = fs::absolute(root, ec).lexically_normal();
  const fs::path path = fs::absolute(DatasetPath(location, root), ec).lexically_normal();
  const fs::path rel = path.lexically_relative(base);
  if (!ec && !rel.empty() && *rel.begin() != "..") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "dataset '", location, "' lies outside the data root; name a path under it (relative paths resolve there) "
      "or a synthetic:// dataset"));
}

absl::StatusOr<DatasetFiles> ResolveDataset(const std::string& location, const DatasetOptions& options) {
  if (location.empty()) return absl::InvalidArgumentError("no dataset: spec.data.dataset is empty");
  std::string path;
  if (absl::StartsWith(location, "synthetic://")) {
    absl::StatusOr<std::string> dir = MaterializeSynthetic(location, options);
    if (!dir.ok()) return dir.status();
    path = *dir;
  } else {
    if (absl::StrContains(location, "://") && !absl::StartsWith(location, "file://")) {
      return Bad(location, "unknown scheme (use a path, file://PATH or synthetic://NAME?...)");
    }
    if (absl::Status s = CheckDatasetUnderRoot(location, options.root); !s.ok()) return s;
    path = DatasetPath(location, options.root);
  }
  DatasetFiles files;
  if (IsDirectory(path)) {
    files.train = path + "/train.rfd";
    if (Exists(path + "/eval.rfd")) files.eval = path + "/eval.rfd";
  } else {
    files.train = path;
  }
  if (!Exists(files.train)) {
    return absl::NotFoundError(absl::StrCat("dataset '", location, "': ", files.train, " does not exist on the loader"));
  }
  return files;
}

absl::StatusOr<std::string> ResolveEvalFile(const std::string& dataset, const std::string& eval_dataset,
                                            const DatasetOptions& options) {
  if (!eval_dataset.empty()) {
    absl::StatusOr<DatasetFiles> files = ResolveDataset(eval_dataset, options);
    if (!files.ok()) return files.status();
    return files->eval.empty() ? files->train : files->eval;
  }
  absl::StatusOr<DatasetFiles> files = ResolveDataset(dataset, options);
  return files.ok() ? files->eval : std::string();
}

absl::StatusOr<data::LoaderOptions> LoaderOptionsFor(const v1::DataConfig& config, const std::string& train_file) {
  auto bad = [](const std::string& field, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("data config ", field, " ", what));
  };
  if (config.num_ranks() < 1) return bad("num_ranks", absl::StrCat("must be >= 1, got ", config.num_ranks()));
  if (config.local_batch_size() < 1) {
    return bad("local_batch_size", absl::StrCat("must be >= 1, got ", config.local_batch_size()));
  }
  if (config.base_batch_size() < 1 || config.local_batch_size() % config.base_batch_size() != 0) {
    return bad("base_batch_size", absl::StrCat("must divide local_batch_size ", config.local_batch_size(), ", got ",
                                               config.base_batch_size()));
  }
  data::LoaderOptions o;
  o.files = {train_file};
  o.deal.ranks = config.num_ranks();
  o.deal.base_batch = config.base_batch_size();
  o.deal.base_batches_per_rank = config.local_batch_size() / config.base_batch_size();
  const int micro = std::max(config.micro_batches(), 1);
  if (o.deal.base_batches_per_rank % micro != 0) {
    return bad("micro_batches", absl::StrCat("must divide the ", o.deal.base_batches_per_rank, " base batches per rank"));
  }
  o.deal.micro_batch_base_batches = o.deal.base_batches_per_rank / micro;
  absl::StatusOr<data::Policy> policy = data::ParsePolicy(config.policy().empty() ? "recfleet" : config.policy());
  if (!policy.ok()) return bad("policy", std::string(policy.status().message()));
  o.policy = *policy;
  absl::StatusOr<data::CostModel> cost = data::CostModel::Parse(config.cost_model().empty() ? "linear" : config.cost_model());
  if (!cost.ok()) return bad("cost_model", std::string(cost.status().message()));
  o.cost = *cost;
  o.seed = config.seed();
  // Every sample is trained once per epoch: the epoch's last step may be
  // short (ranks weight their gradients by their share of the step).
  o.drop_remainder = false;
  return o;
}

absl::StatusOr<std::shared_ptr<JobLoader>> JobLoader::Open(const v1::DataConfig& config,
                                                           const DatasetOptions& options) {
  absl::StatusOr<DatasetFiles> files = ResolveDataset(config.dataset(), options);
  if (!files.ok()) return files.status();
  absl::StatusOr<data::LoaderOptions> lo = LoaderOptionsFor(config, files->train);
  if (!lo.ok()) return lo.status();
  absl::StatusOr<std::unique_ptr<data::Loader>> loader = data::Loader::Open(*lo);
  if (!loader.ok()) return loader.status();
  std::shared_ptr<JobLoader> j(new JobLoader());
  j->config_ = config;
  j->eval_file_ = files->eval;
  j->schema_ = (*loader)->schema();
  j->steps_per_epoch_ = (*loader)->steps_per_epoch();
  if (j->steps_per_epoch_ < 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset '", config.dataset(), "' has ", (*loader)->samples_per_epoch(),
                     " samples, fewer than one step of ", config.num_ranks(), " ranks x ", config.local_batch_size()));
  }
  SchemaToProto(*j->schema_, &j->info_);
  j->info_.set_first_rank(0);
  j->info_.set_num_ranks(config.num_ranks());
  j->info_.set_steps_per_epoch(j->steps_per_epoch_);
  j->info_.set_samples_per_epoch((*loader)->samples_per_epoch());
  j->info_.set_base_batch_size(lo->deal.base_batch);
  j->info_.set_base_batches_per_rank(lo->deal.base_batches_per_rank);
  j->info_.set_policy(std::string(data::PolicyName(lo->policy)));
  j->info_.set_cost_model(lo->cost.ToString());
  j->info_.set_seed(lo->seed);
  j->info_.set_instance(0);
  j->info_.set_num_instances(1);
  absl::MutexLock l(&j->mu_);
  j->loader_ = std::move(*loader);
  return j;
}

absl::StatusOr<std::shared_ptr<const data::StepPlan>> JobLoader::TakePlan(int64_t epoch, int64_t step, int rank,
                                                                          bool* first_time) {
  if (first_time != nullptr) *first_time = false;
  absl::MutexLock l(&mu_);
  const auto key = std::make_pair(epoch, step);
  auto it = cache_.begin();
  while (it != cache_.end() && it->key != key) ++it;
  if (it == cache_.end()) {
    absl::StatusOr<std::shared_ptr<const data::StepPlan>> plan = loader_->Plan(epoch, step);
    if (!plan.ok()) return plan.status();
    if (key > last_first_) {
      last_first_ = key;
      if (first_time != nullptr) *first_time = true;
    }
    cache_.push_front({key, *std::move(plan), std::vector<bool>(config_.num_ranks(), false), 0});
    if (cache_.size() > kCacheCapacity) cache_.pop_back();
    it = cache_.begin();
  } else {
    cache_.splice(cache_.begin(), cache_, it);
    it = cache_.begin();
  }
  std::shared_ptr<const data::StepPlan> plan = it->plan;
  if (!it->taken[rank]) {
    it->taken[rank] = true;
    if (++it->taken_count == config_.num_ranks()) cache_.erase(it);  // Every rank has it.
  }
  return plan;
}

absl::StatusOr<std::shared_ptr<JobLoader>> JobLoaders::Get(const v1::DataConfig& config) {
  if (config.job().empty()) return absl::InvalidArgumentError("data config job is required (the job's name)");
  const std::string key = config.SerializeAsString();
  std::vector<std::string> closed;
  {
    absl::MutexLock l(&mu_);
    const absl::Time now = absl::Now();
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      if (it->first != config.job() && now - it->second.last_use > idle_close_ &&
          it->second.loader.use_count() == 1) {
        closed.push_back(it->first);
        it = jobs_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (on_close_) {
    for (const std::string& job : closed) on_close_(job);
  }
  {
    absl::MutexLock l(&mu_);
    const absl::Time now = absl::Now();
    auto it = jobs_.find(config.job());
    if (it != jobs_.end()) {
      if (it->second.key != key) {
        return absl::FailedPreconditionError(
            absl::StrCat(config.job(), " is already open here with another data configuration (",
                         it->second.loader->config().ShortDebugString(), "); a job's ranks must share one"));
      }
      it->second.last_use = now;
      return it->second.loader;
    }
  }
  // Opened outside the lock: reading the file index (or generating a
  // synthetic dataset) must not hold up other jobs' streams.
  absl::StatusOr<std::shared_ptr<JobLoader>> opened = JobLoader::Open(config, options_);
  if (!opened.ok()) return opened.status();
  absl::MutexLock l(&mu_);
  auto [it, inserted] = jobs_.try_emplace(config.job(), Entry{key, *opened, absl::Now()});
  if (!inserted && it->second.key != key) {
    return absl::FailedPreconditionError(
        absl::StrCat(config.job(), " was opened here with another data configuration meanwhile"));
  }
  return it->second.loader;
}

int JobLoaders::open_jobs() {
  absl::MutexLock l(&mu_);
  return static_cast<int>(jobs_.size());
}

}  // namespace recfleet::dataloader
