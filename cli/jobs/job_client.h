#ifndef RECFLEET_CLI_JOBS_JOB_CLIENT_H_
#define RECFLEET_CLI_JOBS_JOB_CLIENT_H_

// The CLI's connection to the coordinator's JobService: address from
// --coordinator or $RECFLEET_COORDINATOR, bearer token from
// $RECFLEET_AUTH_TOKEN (or --auth-token-file), TLS from --tls-ca (or
// $RECFLEET_TLS_CA), a deadline on every unary call. Not thread-safe (one
// command, one client).

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "recfleet/v1/job_service.grpc.pb.h"

namespace recfleet::cli {

class JobClient {
 public:
  // Errors: INVALID_ARGUMENT when no address is given or it is not host:port.
  // `credentials` null = plain text.
  static absl::StatusOr<std::unique_ptr<JobClient>> Connect(
      const std::string& address, std::string token, absl::Duration timeout,
      std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

  // CreateJob, retried on UNAVAILABLE with the same request_id (so a retry
  // never creates a second job).
  absl::StatusOr<::recfleet::v1::Job> CreateJob(const ::recfleet::v1::CreateJobRequest& request);
  absl::StatusOr<::recfleet::v1::Job> GetJob(const std::string& name);
  absl::StatusOr<::recfleet::v1::ListJobsResponse> ListJobs(
      const ::recfleet::v1::ListJobsRequest& request);
  absl::StatusOr<::recfleet::v1::Job> CancelJob(const std::string& name, const std::string& reason);
  absl::Status DeleteJob(const std::string& name);
  // A dry-run plan of `request.spec` on the workers registered now.
  absl::StatusOr<::recfleet::v1::PlanJobResponse> PlanJob(
      const ::recfleet::v1::PlanJobRequest& request);
  // The job's recorded state changes, oldest first.
  absl::StatusOr<::recfleet::v1::ListJobEventsResponse> ListJobEvents(const std::string& name);
  // The registered workers.
  absl::StatusOr<::recfleet::v1::ListWorkersResponse> ListWorkers();
  // Calls `on_event` for every message until the stream ends; returns the
  // stream's status (OK when the job reached a terminal state).
  absl::Status WatchJob(const std::string& name, bool include_progress,
                        const std::function<void(const ::recfleet::v1::WatchJobResponse&)>& on_event);

  const std::string& address() const { return address_; }

 private:
  JobClient(std::string address, std::string token, absl::Duration timeout,
            std::shared_ptr<grpc::ChannelCredentials> credentials);
  void Prepare(grpc::ClientContext* context, bool deadline) const;
  // One unary call with the token and the deadline; transport errors name
  // the address.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(
      grpc::Status (::recfleet::v1::JobService::Stub::*method)(grpc::ClientContext*,
                                                             const Request&, Response*),
      const Request& request);

  std::string address_;
  std::string token_;
  absl::Duration timeout_;
  std::unique_ptr<::recfleet::v1::JobService::Stub> stub_;
};

}  // namespace recfleet::cli

#endif  // RECFLEET_CLI_JOBS_JOB_CLIENT_H_
