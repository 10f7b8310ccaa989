#ifndef RECFLEET_WORKER_AGENT_H_
#define RECFLEET_WORKER_AGENT_H_

// The worker daemon's control loop: registers with the coordinator, renews
// its lease by heartbeats, and turns the commands in heartbeat replies into
// task starts and stops (the contract is in worker_service.proto):
//  - An Assignment for a (job, restart_epoch) other than the current task's
//    starts a TaskRunner on its own thread. Repeats of the current
//    assignment are ignored. While an older task is still stopping, a new
//    assignment is not acknowledged; the coordinator repeats it, and it
//    starts once the old task has returned.
//  - An Abort for the current job at the task's epoch or newer stops the
//    task (TaskControl::stop_requested, OnStop callbacks such as aborting
//    the collectives) and the worker reports itself idle.
//  - A heartbeat answered NOT_FOUND (the lease expired and the coordinator
//    forgot the worker) re-registers under the same worker id.
// The heartbeat thread never waits for a task, so the lease stays alive
// while a task winds down.
//
// Thread-safety: Run() on one thread; Stop() from any thread.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "recfleet/v1/worker_service.grpc.pb.h"

namespace recfleet::worker {

// What a running task sees of the agent. Thread-safe.
class TaskControl {
 public:
  // True once the task must stop (Abort, shutdown, or a newer epoch).
  bool stop_requested() const { return stopping_.load(); }
  // Waits up to `timeout` for a stop request; true if one arrived, and then
  // every OnStop callback registered before it has run.
  bool WaitForStop(absl::Duration timeout) const { return stop_.WaitForNotificationWithTimeout(timeout); }
  // Runs `callback` when a stop is requested (at once if already
  // requested), on the thread requesting it: e.g. Communicator::Abort, so a
  // collective in flight fails instead of waiting for its timeout.
  void OnStop(std::function<void()> callback);
  // Marks the task RUNNING (collectives joined, training started); the
  // coordinator moves the job to RUNNING once every rank has.
  void SetRunning();

  // The worker id to put in ReportStep and rendezvous calls.
  const std::string& worker_id() const { return worker_id_; }
  // The credential to send with it (worker_service.proto, "Worker
  // identity"). Read it per call: it changes when the agent registers again,
  // e.g. after a coordinator restart, while the task keeps running.
  std::string worker_credential() const;

  // The Agent makes one per assignment; a run outside a daemon (`recfleet
  // train --local`) makes its own, and may stop it with RequestStop.
  explicit TaskControl(std::string worker_id, std::string worker_credential = "")
      : worker_id_(std::move(worker_id)), credential_(std::move(worker_credential)) {}
  void RequestStop();

 private:
  friend class Agent;

  void set_worker_credential(std::string credential);

  const std::string worker_id_;
  std::atomic<bool> stopping_{false};  // Set first; stop_ after the callbacks.
  absl::Notification stop_;
  mutable absl::Mutex mu_;
  std::vector<std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  std::string credential_ ABSL_GUARDED_BY(mu_);
};

// Runs one assignment to its end on the calling thread: OK when every step
// is done; an error (reported as FAILED) otherwise. Must return promptly
// after control.stop_requested() becomes true. Run is called for one
// assignment at a time.
class TaskRunner {
 public:
  virtual ~TaskRunner() = default;
  virtual absl::Status Run(const v1::Assignment& assignment, TaskControl& control) = 0;
};

struct AgentOptions {
  v1::RegisterWorkerRequest registration;
  // The workers' token (the coordinator's --worker_token_file), sent as
  // "authorization: Bearer <token>" when non-empty.
  std::string auth_token;
  // Deadline of each RPC to the coordinator.
  absl::Duration rpc_timeout = absl::Seconds(5);
  // Used until the coordinator states its interval at registration.
  absl::Duration default_heartbeat_interval = absl::Seconds(1);
  // Retry delay after a failed RegisterWorker (coordinator not up yet).
  absl::Duration register_retry = absl::Milliseconds(200);
};

class Agent {
 public:
  Agent(std::shared_ptr<v1::WorkerService::StubInterface> stub, AgentOptions options, TaskRunner* runner);
  ~Agent();  // Stops and joins a task still running.

  // Registers (retrying until the coordinator answers or Stop()), then
  // heartbeats until Stop(). Returns after asking any running task to stop
  // and joining it.
  absl::Status Run();
  // Ends Run(). Thread-safe, idempotent.
  void Stop() { shutdown_.Notify(); }

  // Empty until registered.
  std::string worker_id() const;
  // Invoked once with the worker id after the first registration.
  void set_on_registered(std::function<void(const std::string&)> cb) { on_registered_ = std::move(cb); }

 private:
  struct Task;

  absl::Status Register();
  absl::Status Heartbeat();
  void Apply(const v1::WorkerCommand& command);
  void StartTask(const v1::Assignment& assignment);
  v1::TaskStatus CurrentStatus();
  bool TaskThreadDone();

  const std::shared_ptr<v1::WorkerService::StubInterface> stub_;
  const AgentOptions options_;
  TaskRunner* const runner_;
  absl::Notification shutdown_;
  std::function<void(const std::string&)> on_registered_;

  mutable absl::Mutex mu_;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  // The current registration's credential; only the Run() thread uses it.
  std::string credential_;
  absl::Duration heartbeat_interval_;
  std::unique_ptr<Task> task_;  // Only the Run() thread touches the pointer.
};

}  // namespace recfleet::worker

#endif  // RECFLEET_WORKER_AGENT_H_
