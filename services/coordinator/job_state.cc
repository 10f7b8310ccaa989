#include "services/coordinator/job_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace recfleet::coordinator {

using ::recfleet::v1::JobStatus;

bool IsTerminal(JobState state) {
  return state == JobStatus::SUCCEEDED || state == JobStatus::FAILED ||
         state == JobStatus::CANCELLED;
}

std::vector<JobState> NextStates(JobState from) {
  switch (from) {
    case JobStatus::QUEUED:
      return {JobStatus::SCHEDULING, JobStatus::CANCELLED};
    case JobStatus::SCHEDULING:
      return {JobStatus::RUNNING, JobStatus::QUEUED, JobStatus::FAILED, JobStatus::CANCELLED};
    case JobStatus::RUNNING:
      return {JobStatus::SUCCEEDED, JobStatus::FAILED, JobStatus::RESTARTING,
              JobStatus::CANCELLED};
    case JobStatus::RESTARTING:
      return {JobStatus::SCHEDULING, JobStatus::FAILED, JobStatus::CANCELLED};
    default:
      return {};
  }
}

std::string StateName(JobState state) { return JobStatus::State_Name(state); }

const std::vector<JobState>& AllStates() {
  static const auto* states = new std::vector<JobState>{
      JobStatus::QUEUED,    JobStatus::SCHEDULING, JobStatus::RUNNING,  JobStatus::RESTARTING,
      JobStatus::SUCCEEDED, JobStatus::FAILED,     JobStatus::CANCELLED};
  return *states;
}

absl::Status CheckTransition(const std::string& job_name, JobState from, JobState to) {
  std::vector<JobState> next = NextStates(from);
  if (std::find(next.begin(), next.end(), to) != next.end()) return absl::OkStatus();
  std::string allowed =
      next.empty() ? std::string("nowhere (it is terminal)")
                   : absl::StrJoin(next, ", ", [](std::string* out, JobState s) {
                       out->append(StateName(s));
                     });
  return absl::FailedPreconditionError(absl::StrCat(job_name, ": illegal transition ",
                                                    StateName(from), " -> ", StateName(to),
                                                    "; from ", StateName(from),
                                                    " the job may go to ", allowed));
}

}  // namespace recfleet::coordinator
