#ifndef RECFLEET_SERVICES_COORDINATOR_SPEC_VALIDATION_H_
#define RECFLEET_SERVICES_COORDINATOR_SPEC_VALIDATION_H_

// Checks a JobSpec before the coordinator accepts it. Every problem is
// reported with its field path, the expected form and the value found:
//   "spec.model.tables[2].dim must be > 0, got 0"
// Pure functions; thread-safe.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "recfleet/v1/job.pb.h"

namespace recfleet::coordinator {

// Every violation in `spec`, in field order; empty when the spec is valid.
std::vector<std::string> SpecViolations(const ::recfleet::v1::JobSpec& spec);

// OK, or INVALID_ARGUMENT whose message lists the violations ("; "-joined).
// Structural only: what recfleet does not build yet (engine::CheckBuildable)
// is checked on top of it where a job is to run (CreateJob, train --local);
// a dry-run plan (PlanJob, `recfleet plan`) accepts any well-formed spec.
absl::Status ValidateJobSpec(const ::recfleet::v1::JobSpec& spec);

// World size the spec asks for: workers * max(gpus_per_worker, 1).
int64_t WorldSize(const ::recfleet::v1::JobSpec& spec);

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_SPEC_VALIDATION_H_
