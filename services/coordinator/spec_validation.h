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
#include "services/common/rpc_status.h"

namespace recfleet::coordinator {

// Size limits. Specs are stored, listed and sent to every worker whole, so
// an unbounded one would make ListJobs replies and assignments too large
// for a gRPC message (4 MiB by default).
inline constexpr int64_t kMaxSpecBytes = 256 << 10;  // Serialized JobSpec.
inline constexpr int kMaxLabels = 64;
inline constexpr size_t kMaxLabelKeyBytes = 63;
inline constexpr size_t kMaxLabelValueBytes = 256;

// Every violation in `spec`, in field order; empty when the spec is valid.
// A spec over kMaxSpecBytes yields only that violation.
std::vector<std::string> SpecViolations(const ::recfleet::v1::JobSpec& spec);
// The same as (field path, description) pairs.
std::vector<FieldViolation> SpecFieldViolations(const ::recfleet::v1::JobSpec& spec);

// OK, or INVALID_ARGUMENT whose message lists the violations ("; "-joined)
// and whose google.rpc.BadRequest detail (services/common/rpc_status.h)
// holds them one by one.
// Structural only: what recfleet does not build yet (engine::CheckBuildable)
// is checked on top of it where a job is to run (CreateJob, train --local)
// and by `recfleet plan` (unless --what-if); the coordinator's dry-run
// PlanJob accepts any well-formed spec.
absl::Status ValidateJobSpec(const ::recfleet::v1::JobSpec& spec);

// World size the spec asks for: workers * max(gpus_per_worker, 1).
int64_t WorldSize(const ::recfleet::v1::JobSpec& spec);

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_SPEC_VALIDATION_H_
