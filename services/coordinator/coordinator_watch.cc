#include "services/coordinator/coordinator.h"

#include "services/coordinator/job_state.h"

namespace recfleet::coordinator {

using ::recfleet::v1::Job;
using ::recfleet::v1::WatchJobResponse;

absl::StatusOr<Coordinator::JobEvent> Coordinator::WatchSnapshot(const std::string& name) {
  absl::StatusOr<std::string> id = ParseJobName(name, "name");
  if (!id.ok()) return id.status();
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Job> job = LoadJobLocked(*id);
  if (!job.ok()) return job.status();
  WatchJobResponse snapshot;
  snapshot.set_kind(WatchJobResponse::SNAPSHOT);
  *snapshot.mutable_job() = *std::move(job);
  return JobEvent{events_.LastSeq(*id), std::move(snapshot)};
}

absl::StatusOr<std::vector<Coordinator::JobEvent>> Coordinator::WaitJobEvents(
    const std::string& name, int64_t after, absl::Time deadline) {
  absl::StatusOr<std::string> id = ParseJobName(name, "name");
  if (!id.ok()) return id.status();
  absl::MutexLock lock(&mu_);
  while (true) {
    JobEventLog::Since since = events_.EventsAfter(*id, after);
    if (since.missed) {
      // The caller missed events that were dropped: resynchronize.
      absl::StatusOr<Job> job = LoadJobLocked(*id);
      if (!job.ok()) return job.status();
      WatchJobResponse snapshot;
      snapshot.set_kind(WatchJobResponse::SNAPSHOT);
      *snapshot.mutable_job() = *std::move(job);
      std::vector<JobEvent> out;
      out.emplace_back(events_.LastSeq(*id), std::move(snapshot));
      return out;
    }
    if (!since.events.empty()) return std::move(since.events);
    if (stop_.HasBeenNotified()) {
      return absl::UnavailableError("the coordinator is shutting down; watch again later");
    }
    if (events_cv_.WaitWithDeadline(&mu_, deadline)) return std::vector<JobEvent>();
  }
}

void Coordinator::EmitLocked(const std::string& id, WatchJobResponse event) {
  events_.Append(id, std::move(event));
  events_cv_.SignalAll();
}

}  // namespace recfleet::coordinator
