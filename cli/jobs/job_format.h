#ifndef RECFLEET_CLI_JOBS_JOB_FORMAT_H_
#define RECFLEET_CLI_JOBS_JOB_FORMAT_H_

// How `recfleet` prints jobs: aligned tables and blocks for people, JSON or
// YAML (proto field names, enums by name) for scripts. Times are shown in UTC.
// Pure functions; thread-safe.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "google/protobuf/message.h"
#include "absl/time/time.h"
#include "recfleet/v1/job_service.pb.h"

namespace recfleet::cli {

// NAME / DISPLAY_NAME / STATE / STEP / WORKERS / CREATED / REASON.
std::string FormatJobTable(const std::vector<::recfleet::v1::Job>& jobs);

// A key/value block with state, workers, times and progress.
std::string FormatJobDetail(const ::recfleet::v1::Job& job);

// TIME / FROM / TO / EPOCH / REASON / MESSAGE, one row per recorded state
// change.
std::string FormatEventTable(const std::vector<::recfleet::v1::JobTransition>& events);
// WORKER / HOST / GPUS / NODE / NVLINK / ZONE / STATE / JOB / RANK / TASK /
// LEASE_LEFT; the lease is counted from `now`.
std::string FormatWorkerTable(const std::vector<::recfleet::v1::WorkerInfo>& workers,
                              absl::Time now);
// One line per watch event (no trailing newline).
std::string FormatWatchEvent(const ::recfleet::v1::WatchJobResponse& event);

// Canonical proto3 JSON with snake_case names; `pretty` adds indentation.
std::string ToJson(const google::protobuf::Message& message, bool pretty);

// The same document as block-style YAML (what `-o yaml` prints).
std::string ToYaml(const google::protobuf::Message& message);

// ListJobsRequest.filter from `recfleet list`'s --filter (passed through) and
// -l/--selector "KEY=VALUE[,KEY=VALUE...]" (each pair a quoted label term),
// joined by AND. INVALID_ARGUMENT for a selector pair without '=' or key.
absl::StatusOr<std::string> ListFilter(const std::string& filter, const std::string& selector);

}  // namespace recfleet::cli

#endif  // RECFLEET_CLI_JOBS_JOB_FORMAT_H_
