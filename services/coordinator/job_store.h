#ifndef RECFLEET_SERVICES_COORDINATOR_JOB_STORE_H_
#define RECFLEET_SERVICES_COORDINATOR_JOB_STORE_H_

// Durable job records in an embedded SQLite database: every job (spec and
// latest status) and every state transition, one row each. A coordinator
// that restarts on the same file finds every job and every transition it
// had committed (WAL journal, synchronous=NORMAL: safe against a process
// crash; a power loss may drop the last transactions).
//
// The store enforces the lifecycle of job_state.h: RecordTransition refuses
// an illegal transition with FAILED_PRECONDITION.
//
// Thread-safe: one connection behind a mutex.

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "recfleet/v1/job.pb.h"
#include "services/coordinator/job_state.h"

struct sqlite3;
struct sqlite3_stmt;

namespace recfleet::coordinator {

class JobStore {
 public:
  // Opens (creating if needed) the database at `path`; ":memory:" gives a
  // private in-memory store. Errors: UNAVAILABLE naming the path and the
  // SQLite reason; FAILED_PRECONDITION for a database of a newer schema.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  ~JobStore();

  // Creates a QUEUED job (recording the transition STATE_UNSPECIFIED ->
  // QUEUED, reason "Submitted"), named jobs/<job_id> when `job_id` is given
  // (the caller validated it; ALREADY_EXISTS if a job has it), else under a
  // fresh id. With a non-empty request_id that is already stored, returns
  // the existing job and sets *created = false instead; ALREADY_EXISTS if
  // that job's spec (or the job_id asked for) differs. The request_id is
  // kept with the job for that purpose but is not part of the resource.
  absl::StatusOr<::recfleet::v1::Job> Create(const ::recfleet::v1::JobSpec& spec,
                                             const std::string& request_id, absl::Time now,
                                             bool* created, const std::string& job_id = "");

  // What Create would return for an already stored request_id, without
  // creating anything: the job (or ALREADY_EXISTS, as Create says) when
  // `request_id` is stored, nullopt when it is empty or not stored. For a
  // caller that refuses a new job but must still answer a retry of one it
  // created.
  absl::StatusOr<std::optional<::recfleet::v1::Job>> FindCreated(const ::recfleet::v1::JobSpec& spec,
                                                                 const std::string& request_id,
                                                                 const std::string& job_id = "");

  // Errors: NOT_FOUND "jobs/<id> not found".
  absl::StatusOr<::recfleet::v1::Job> Get(const std::string& id);

  struct Page {
    std::vector<::recfleet::v1::Job> jobs;
    std::string next_page_token;  // Empty on the last page.
  };
  // What a listing selects: jobs in one of `states` (empty = any) whose
  // spec labels hold every pair of `labels`.
  struct Query {
    std::set<JobState> states;
    std::map<std::string, std::string> labels;
  };
  // Newest first. page_size 1..1000. A page also ends before its jobs'
  // serialized size would pass `max_bytes` (but holds at least one job), so
  // a page of large specs still fits in one gRPC message. Page tokens are
  // opaque: the position plus a MAC (under a key kept in the database) over
  // it and the query, so a token only continues the listing that issued it.
  // Errors: INVALID_ARGUMENT for a token this store did not issue for this
  // query (tampered, or from another query).
  absl::StatusOr<Page> List(int page_size, const std::string& page_token, const Query& query,
                            int64_t max_bytes = int64_t{1} << 20);

  // Replaces the job's status with `status` (whose state is `t.to()`) and
  // appends the transition row, atomically. Errors: NOT_FOUND;
  // FAILED_PRECONDITION if the stored state is not t.from() or the
  // transition is illegal.
  absl::Status RecordTransition(const std::string& id, const ::recfleet::v1::JobStatus& status,
                                const ::recfleet::v1::JobTransition& t);

  // Replaces the job's status without a state change (progress updates).
  // Errors: NOT_FOUND; FAILED_PRECONDITION if `status` changes the state.
  absl::Status SaveStatus(const std::string& id, const ::recfleet::v1::JobStatus& status);

  // Removes a terminal job and its transitions, atomically. Errors:
  // NOT_FOUND; FAILED_PRECONDITION if the stored state is not terminal.
  absl::Status Delete(const std::string& id);

  // Every transition of a job, oldest first.
  absl::StatusOr<std::vector<::recfleet::v1::JobTransition>> Transitions(const std::string& id);

  // Jobs in a non-terminal state, oldest first (recovery after a restart).
  absl::StatusOr<std::vector<::recfleet::v1::Job>> ActiveJobs();

  // Number of jobs per state (every state present, possibly 0).
  absl::StatusOr<std::vector<std::pair<JobState, int64_t>>> CountByState();

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  absl::StatusOr<::recfleet::v1::Job> GetLocked(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::optional<::recfleet::v1::Job>> FindCreatedLocked(const ::recfleet::v1::JobSpec& spec,
                                                                       const std::string& request_id,
                                                                       const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status InsertTransitionLocked(const std::string& id, const ::recfleet::v1::JobTransition& t)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ExecLocked(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  sqlite3_stmt* Prepare(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Error(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The page token of position `seq` under `query`.
  std::string PageToken(int64_t seq, const Query& query) const;

  std::string token_key_;  // Set by Open, then read-only.

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  // Prepared statements by SQL text (the text is a string literal).
  std::vector<std::pair<const char*, sqlite3_stmt*>> statements_ ABSL_GUARDED_BY(mu_);
};

// CreateJobRequest.job_id: empty (the coordinator picks the id) or 1-63
// characters of [a-z0-9-], starting with a letter and not ending with '-'
// (AIP-122). INVALID_ARGUMENT naming job_id otherwise.
absl::Status ValidateJobId(const std::string& job_id);

// "jobs/<id>" -> "<id>"; INVALID_ARGUMENT naming `field` when malformed.
absl::StatusOr<std::string> ParseJobName(const std::string& name, const std::string& field);

// "<id>" -> "jobs/<id>".
std::string JobName(const std::string& id);

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_JOB_STORE_H_
