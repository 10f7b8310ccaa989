#include "worker/agent.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/process_memory.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"

namespace recfleet::worker {
namespace {

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(what, ": ", s.error_message()));
}

void Prepare(grpc::ClientContext* ctx, const AgentOptions& options) {
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(options.rpc_timeout));
  if (!options.auth_token.empty()) ctx->AddMetadata("authorization", "Bearer " + options.auth_token);
}

}  // namespace

void TaskControl::OnStop(std::function<void()> callback) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_.load()) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

std::string TaskControl::worker_credential() const {
  absl::MutexLock lock(&mu_);
  return credential_;
}

void TaskControl::set_worker_credential(std::string credential) {
  absl::MutexLock lock(&mu_);
  credential_ = std::move(credential);
}

void TaskControl::SetRunning() {
  absl::MutexLock lock(&mu_);
  running_ = true;
}

void TaskControl::RequestStop() {
  std::vector<std::function<void()>> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_.load()) return;
    stopping_ = true;
    callbacks.swap(callbacks_);
  }
  for (auto& cb : callbacks) cb();
  // Only now: a task waiting in WaitForStop may return and drop what its
  // callbacks touch.
  stop_.Notify();
}

struct Agent::Task {
  v1::Assignment assignment;
  std::unique_ptr<TaskControl> control;
  std::thread thread;
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status result ABSL_GUARDED_BY(mu);
  // Aborted by the coordinator: report idle, whatever the thread is doing.
  bool aborted = false;
};

Agent::Agent(std::shared_ptr<v1::WorkerService::StubInterface> stub, AgentOptions options, TaskRunner* runner)
    : stub_(std::move(stub)),
      options_(std::move(options)),
      runner_(runner),
      heartbeat_interval_(options_.default_heartbeat_interval) {}

Agent::~Agent() {
  if (task_ != nullptr) {
    task_->control->RequestStop();
    if (task_->thread.joinable()) task_->thread.join();
  }
}

std::string Agent::worker_id() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

absl::Status Agent::Register() {
  v1::RegisterWorkerRequest request = options_.registration;
  request.set_worker_id(worker_id());
  // Lets a live registration be renewed in place; ignored once it ended.
  request.set_worker_credential(credential_);
  // What the process holds before a job (code, libraries, threads): the
  // coordinator adds it to a CPU job's predicted peak.
  if (absl::StatusOr<int64_t> resident = ResidentBytes(); resident.ok()) {
    request.set_resident_memory_bytes(*resident);
  }
  v1::RegisterWorkerResponse response;
  grpc::ClientContext ctx;
  Prepare(&ctx, options_);
  absl::Status s = FromGrpc(stub_->RegisterWorker(&ctx, request, &response), "RegisterWorker");
  if (!s.ok()) return s;
  bool first;
  {
    absl::MutexLock lock(&mu_);
    first = worker_id_.empty();
    worker_id_ = response.worker_id();
  }
  credential_ = response.worker_credential();
  // A task that outlived the old registration (the coordinator restarted
  // and the job kept running) goes on under the new credential.
  if (task_ != nullptr) task_->control->set_worker_credential(credential_);
  if (response.heartbeat_interval_seconds() > 0) {
    heartbeat_interval_ = absl::Seconds(response.heartbeat_interval_seconds());
  }
  spdlog::info("{}", absl::StrFormat("worker %s: registered (lease %.1f s, heartbeat every %.2f s)",
                                     response.worker_id().c_str(), response.lease_seconds(),
                                     absl::ToDoubleSeconds(heartbeat_interval_)));
  if (first && on_registered_) on_registered_(response.worker_id());
  return absl::OkStatus();
}

bool Agent::TaskThreadDone() {
  absl::MutexLock lock(&task_->mu);
  return task_->done;
}

v1::TaskStatus Agent::CurrentStatus() {
  v1::TaskStatus status;
  if (task_ == nullptr || task_->aborted) return status;
  status.set_job(task_->assignment.job());
  status.set_restart_epoch(task_->assignment.restart_epoch());
  absl::MutexLock lock(&task_->mu);
  if (task_->done) {
    status.set_phase(task_->result.ok() ? v1::TaskStatus::SUCCEEDED : v1::TaskStatus::FAILED);
    status.set_message(std::string(task_->result.message()));
  } else {
    absl::MutexLock control_lock(&task_->control->mu_);
    status.set_phase(task_->control->running_ ? v1::TaskStatus::RUNNING : v1::TaskStatus::STARTING);
  }
  return status;
}

void Agent::StartTask(const v1::Assignment& assignment) {
  if (task_ != nullptr && task_->thread.joinable()) task_->thread.join();
  task_ = std::make_unique<Task>();
  task_->assignment = assignment;
  task_->control.reset(new TaskControl(worker_id(), credential_));
  spdlog::info(
      "{}", absl::StrFormat("worker %s: assignment %s rank %d/%d epoch %d resume_step %d", worker_id().c_str(),
                            assignment.job().c_str(), assignment.rank(), assignment.world_size(),
                            static_cast<int>(assignment.restart_epoch()), static_cast<int>(assignment.resume_step())));
  Task* task = task_.get();
  task->thread = std::thread([this, task] {
    absl::Status result = runner_->Run(task->assignment, *task->control);
    spdlog::info("{}", absl::StrFormat("worker %s: task %s epoch %d ended: %s", task->control->worker_id().c_str(),
                                       task->assignment.job().c_str(),
                                       static_cast<int>(task->assignment.restart_epoch()), result.ToString().c_str()));
    absl::MutexLock lock(&task->mu);
    task->done = true;
    task->result = std::move(result);
  });
}

void Agent::Apply(const v1::WorkerCommand& command) {
  if (command.has_assignment()) {
    const v1::Assignment& a = command.assignment();
    if (task_ != nullptr && !task_->aborted && task_->assignment.job() == a.job() &&
        task_->assignment.restart_epoch() == a.restart_epoch()) {
      return;  // The coordinator repeats an assignment until it is acknowledged.
    }
    if (task_ != nullptr && !TaskThreadDone()) {
      // A newer assignment supersedes the running task; start it once the
      // old one has returned (the coordinator keeps repeating it).
      task_->control->RequestStop();
      task_->aborted = true;
      return;
    }
    StartTask(a);
    return;
  }
  if (command.has_abort()) {
    const v1::Abort& abort = command.abort();
    if (task_ != nullptr && task_->assignment.job() == abort.job() &&
        task_->assignment.restart_epoch() <= abort.restart_epoch() && !task_->aborted) {
      spdlog::warn("{}", absl::StrFormat("worker %s: abort %s epoch %d: %s", worker_id().c_str(), abort.job().c_str(),
                                         static_cast<int>(abort.restart_epoch()), abort.reason().c_str()));
      task_->control->RequestStop();
      task_->aborted = true;
    }
  }
}

absl::Status Agent::Heartbeat() {
  v1::HeartbeatRequest request;
  request.set_worker_id(worker_id());
  request.set_worker_credential(credential_);
  v1::TaskStatus status = CurrentStatus();
  if (!status.job().empty()) *request.mutable_task() = status;
  v1::HeartbeatResponse response;
  grpc::ClientContext ctx;
  Prepare(&ctx, options_);
  absl::Status s = FromGrpc(stub_->Heartbeat(&ctx, request, &response), "Heartbeat");
  if (!s.ok()) return s;
  for (const v1::WorkerCommand& command : response.commands()) Apply(command);
  return absl::OkStatus();
}

absl::Status Agent::Run() {
  while (true) {
    absl::Status s = Register();
    if (s.ok()) break;
    spdlog::warn("{}", absl::StrFormat("cannot register yet: %s", s.ToString().c_str()));
    if (shutdown_.WaitForNotificationWithTimeout(options_.register_retry)) return absl::OkStatus();
  }
  // A finished task is reported at once rather than a heartbeat later.
  bool last_done = false;
  do {
    absl::Status s = Heartbeat();
    if (s.code() == absl::StatusCode::kNotFound) {
      spdlog::warn("{}", absl::StrFormat("worker %s: lease lost (%s); registering again", worker_id().c_str(),
                                         std::string(s.message()).c_str()));
      s = Register();
    }
    if (!s.ok()) spdlog::warn("{}", absl::StrFormat("worker %s: %s", worker_id().c_str(), s.ToString().c_str()));
    const absl::Time next = absl::Now() + heartbeat_interval_;
    while (absl::Now() < next && !shutdown_.HasBeenNotified()) {
      const bool done = task_ != nullptr && TaskThreadDone();
      if (done && !last_done) {
        last_done = true;
        break;
      }
      last_done = done;
      shutdown_.WaitForNotificationWithTimeout(absl::Milliseconds(20));
    }
  } while (!shutdown_.HasBeenNotified());
  if (task_ != nullptr) {
    task_->control->RequestStop();
    if (task_->thread.joinable()) task_->thread.join();
  }
  return absl::OkStatus();
}

}  // namespace recfleet::worker
