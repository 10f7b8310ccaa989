#ifndef RECFLEET_SERVICES_COORDINATOR_JOB_STATE_H_
#define RECFLEET_SERVICES_COORDINATOR_JOB_STATE_H_

// The job lifecycle (see JobStatus in proto/recfleet/v1/job.proto):
//
//   QUEUED -> SCHEDULING -> RUNNING -> SUCCEEDED | FAILED
//   SCHEDULING -> QUEUED | FAILED      (a chosen worker was lost | unplaceable)
//   RUNNING -> RESTARTING              (a rank failed or its worker was lost)
//   RESTARTING -> SCHEDULING | FAILED  (workers found again | budget spent)
//   QUEUED | SCHEDULING | RUNNING | RESTARTING -> CANCELLED
//
// Pure functions; thread-safe.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "recfleet/v1/job.pb.h"

namespace recfleet::coordinator {

using JobState = ::recfleet::v1::JobStatus::State;

// SUCCEEDED, FAILED, CANCELLED.
bool IsTerminal(JobState state);

// States reachable from `from` in one step (empty for terminal states).
std::vector<JobState> NextStates(JobState from);

// OK, or FAILED_PRECONDITION "jobs/x: illegal transition RUNNING -> QUEUED;
// from RUNNING the job may go to SUCCEEDED, FAILED, RESTARTING, CANCELLED".
absl::Status CheckTransition(const std::string& job_name, JobState from, JobState to);

// "QUEUED", "RUNNING", ...
std::string StateName(JobState state);

// Every real state (not STATE_UNSPECIFIED), in enum order.
const std::vector<JobState>& AllStates();

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_JOB_STATE_H_
