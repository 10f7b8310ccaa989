#ifndef RECFLEET_TESTS_E2E_LOCAL_CLUSTER_H_
#define RECFLEET_TESTS_E2E_LOCAL_CLUSTER_H_

// A recfleet cluster of real processes on 127.0.0.1 for end-to-end tests:
// the coordinator and worker daemons from the build, each writing its
// output to a log file in a temporary directory, every server on a port the
// OS picks. Tests drive it through the coordinator's JobService.
//
// Not thread-safe; one test thread owns a cluster. The destructor SIGTERMs
// (then SIGKILLs) every process still running.

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "recfleet/v1/job_service.grpc.pb.h"

namespace recfleet::e2e {

// One child process whose stdout and stderr go to `log`.
class Process {
 public:
  static absl::StatusOr<std::unique_ptr<Process>> Start(const std::vector<std::string>& argv,
                                                        const std::string& log);
  ~Process();

  pid_t pid() const { return pid_; }
  const std::string& log() const { return log_; }
  // Sends `sig`; Wait() reaps.
  void Signal(int sig);
  // Exit status as from waitpid (after Signal or a normal exit).
  int Wait();
  bool running();
  // Waits until the log holds a line starting with `prefix`; returns the
  // rest of that line.
  absl::StatusOr<std::string> WaitForLine(const std::string& prefix, absl::Duration timeout);

 private:
  Process(pid_t pid, std::string log) : pid_(pid), log_(std::move(log)) {}
  pid_t pid_;
  std::string log_;
  bool reaped_ = false;
  int status_ = 0;
};

// Where one process of a cluster runs: the command prefix that starts a
// program there (e.g. `ip netns exec NS`; empty = this machine as is) and
// the address the other processes reach it on.
struct Placement {
  std::vector<std::string> exec_prefix;
  std::string address = "127.0.0.1";
};

struct ClusterOptions {
  // Scratch directory for databases, logs, checkpoints and work dirs.
  std::string dir;
  double lease_seconds = 3;
  int workers = 2;
  // Passed to every worker: per-rank logs of trained sample ids.
  bool sample_logs = true;
  // When set: a data-loader (`recfleet data serve`) serves every job its
  // data, and the coordinator hands its address to the workers; otherwise
  // the workers read and deal their jobs' data themselves.
  bool loader = false;
  // Every connection over TLS (deploy/tls/make-certs.sh certificates), the
  // coordinator behind a users' and a workers' token, the loader behind the
  // workers' token and data grants, as a deployment runs; jobs() then
  // carries the users' token.
  bool tls = false;
  // Where "coordinator", "loader" and "worker<i>" run; unset = all on
  // 127.0.0.1. With TLS the server certificate names every address.
  std::function<Placement(const std::string& process)> place;
  // Passed to every worker.
  double comm_timeout_seconds = 20;
  // More flags for every worker (e.g. --device=cuda).
  std::vector<std::string> worker_flags;
};

// What the final model of a job of `ranks` x `samples_per_rank_step`
// samples for `steps` steps was trained on, from its sample logs: every
// step as trained by the newest attempt that reached it. OK when every
// sample was trained exactly once, each resumed attempt started right
// after a multiple of `checkpoint_every` and replayed exactly the samples
// earlier attempts had at the same steps, and (if `restarted`) every rank
// ran more than one attempt; else an error listing what is wrong.
struct SampleLogCheck {
  int ranks = 2;
  int64_t steps = 0;
  int64_t samples_per_rank_step = 0;
  int64_t checkpoint_every = 0;
  bool restarted = true;
};
class LocalCluster {
 public:
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const ClusterOptions& options);
  ~LocalCluster();

  const std::string& coordinator_address() const { return coordinator_address_; }
  // Empty without a loader.
  const std::string& loader_address() const { return loader_address_; }
  v1::JobService::Stub& jobs() { return *jobs_; }
  std::string sample_log_dir() const { return options_.dir + "/samples"; }

  // Starts one more worker daemon (e.g. replacing a killed one).
  absl::Status AddWorker();
  Process& worker(int i) { return *workers_[i]; }
  // The id worker `i` registered under.
  const std::string& worker_id(int i) const { return worker_ids_[i]; }
  int num_workers() const { return static_cast<int>(workers_.size()); }
  const std::vector<std::string>& worker_metrics_addresses() const { return metrics_addresses_; }

  // CreateJob with `spec`.
  absl::StatusOr<v1::Job> CreateJob(const v1::JobSpec& spec);
  // CheckExactlyOnce on `job`'s sample logs.
  absl::Status CheckTrainedExactlyOnce(const v1::Job& job, const SampleLogCheck& check) const;
  // Polls GetJob until `done(job)` or the timeout; returns the last job.
  absl::StatusOr<v1::Job> WaitForJob(const std::string& name, const std::function<bool(const v1::Job&)>& done,
                                     absl::Duration timeout);
  // A log of every process, for failure messages.
  std::string DumpLogs() const;

 private:
  explicit LocalCluster(ClusterOptions options) : options_(std::move(options)) {}

  ClusterOptions options_;
  std::unique_ptr<Process> loader_;
  std::unique_ptr<Process> coordinator_;
  std::vector<std::unique_ptr<Process>> workers_;
  std::vector<std::string> metrics_addresses_;
  std::vector<std::string> worker_ids_;
  std::string coordinator_address_;
  std::string loader_address_;
  std::vector<std::string> worker_security_;  // TLS and token flags.
  Placement Place(const std::string& process) const;
  // `program`'s argv under `process`'s placement.
  std::vector<std::string> Command(const std::string& process, std::vector<std::string> argv) const;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

// A small synthetic dataset (`recfleet data synth` format) in `dir`.
absl::Status MakeSyntheticDataset(const std::string& dir, int64_t samples);

// A small GEM-lite job on MakeSyntheticDataset's columns, for `workers` CPU
// workers.
v1::JobSpec SmallJobSpec(const std::string& dataset_dir, const std::string& checkpoint_dir, int64_t steps,
                         int64_t checkpoint_every, int workers, int local_batch);

// SmallJobSpec for two workers with the dense parameters sharded over both
// ranks (FSDP 2) and the tables split between them, so a restart restores
// FSDP shards and table shards with their optimizer state.
v1::JobSpec ShardedTwoWorkerJobSpec(const std::string& dataset_dir, const std::string& checkpoint_dir, int64_t steps,
                                    int64_t checkpoint_every, int local_batch);

// The sample logs of `job_id` (worker --sample_log_dir): for each rank, for
// each restart epoch, step -> sample ids in training order.
using SampleLog = std::map<int, std::map<int64_t, std::map<int64_t, std::vector<int64_t>>>>;
absl::StatusOr<SampleLog> ReadSampleLogs(const std::string& dir, const std::string& job_id);

absl::Status CheckExactlyOnce(const SampleLog& logs, const SampleLogCheck& check);

// Path of a binary of this workspace in the test's runfiles
// ("services/coordinator/recfleet-coordinator").
std::string RunfilesPath(const std::string& workspace_relative);

}  // namespace recfleet::e2e

#endif  // RECFLEET_TESTS_E2E_LOCAL_CLUSTER_H_
