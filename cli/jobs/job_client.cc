#include "cli/jobs/job_client.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "services/common/address.h"
#include "services/common/bearer_auth.h"
#include "services/common/rpc_status.h"

namespace recfleet::cli {

using ::recfleet::v1::Job;

JobClient::JobClient(std::string address, std::string token, absl::Duration timeout,
                     std::shared_ptr<grpc::ChannelCredentials> credentials)
    : address_(std::move(address)), token_(std::move(token)), timeout_(timeout) {
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  stub_ = ::recfleet::v1::JobService::NewStub(grpc::CreateChannel(address_, credentials));
}

absl::StatusOr<std::unique_ptr<JobClient>> JobClient::Connect(
    const std::string& address, std::string token, absl::Duration timeout,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  if (address.empty()) {
    return absl::InvalidArgumentError(
        "no coordinator address: pass --coordinator host:port or set RECFLEET_COORDINATOR");
  }
  if (absl::StatusOr<HostPort> hp = ParseHostPort(address, "--coordinator"); !hp.ok()) {
    return hp.status();
  }
  return std::unique_ptr<JobClient>(
      new JobClient(address, std::move(token), timeout, std::move(credentials)));
}

void JobClient::Prepare(grpc::ClientContext* context, bool deadline) const {
  AttachBearerToken(token_, context);
  if (deadline) context->set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
}

namespace {

// Adds where the call went to transport errors, which is what users act on.
absl::Status Annotate(const grpc::Status& s, const std::string& address) {
  absl::Status out = FromGrpcStatus(s);
  if (out.code() == absl::StatusCode::kUnavailable ||
      out.code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::Status(out.code(), absl::StrCat("coordinator at ", address,
                                                 " is not answering: ", out.message()));
  }
  return out;
}

}  // namespace

absl::StatusOr<Job> JobClient::CreateJob(const ::recfleet::v1::CreateJobRequest& request) {
  absl::Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(200 << attempt));
    grpc::ClientContext context;
    Prepare(&context, true);
    Job job;
    grpc::Status s = stub_->CreateJob(&context, request, &job);
    if (s.ok()) return job;
    last = Annotate(s, address_);
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
  }
  return last;
}

// One unary call of the JobService with the token and the deadline.
template <typename Request, typename Response>
absl::StatusOr<Response> JobClient::Call(
    grpc::Status (::recfleet::v1::JobService::Stub::*method)(grpc::ClientContext*, const Request&,
                                                           Response*),
    const Request& request) {
  grpc::ClientContext context;
  Prepare(&context, true);
  Response response;
  grpc::Status s = (stub_.get()->*method)(&context, request, &response);
  if (!s.ok()) return Annotate(s, address_);
  return response;
}

using Stub = ::recfleet::v1::JobService::Stub;

absl::StatusOr<Job> JobClient::GetJob(const std::string& name) {
  ::recfleet::v1::GetJobRequest request;
  request.set_name(name);
  return Call(&Stub::GetJob, request);
}

absl::StatusOr<::recfleet::v1::ListJobsResponse> JobClient::ListJobs(
    const ::recfleet::v1::ListJobsRequest& request) {
  return Call(&Stub::ListJobs, request);
}

absl::StatusOr<Job> JobClient::CancelJob(const std::string& name, const std::string& reason) {
  ::recfleet::v1::CancelJobRequest request;
  request.set_name(name);
  request.set_reason(reason);
  return Call(&Stub::CancelJob, request);
}

absl::Status JobClient::DeleteJob(const std::string& name) {
  ::recfleet::v1::DeleteJobRequest request;
  request.set_name(name);
  return Call(&Stub::DeleteJob, request).status();
}

absl::StatusOr<::recfleet::v1::PlanJobResponse> JobClient::PlanJob(
    const ::recfleet::v1::PlanJobRequest& request) {
  return Call(&Stub::PlanJob, request);
}

absl::StatusOr<::recfleet::v1::ListJobEventsResponse> JobClient::ListJobEvents(
    const std::string& name) {
  ::recfleet::v1::ListJobEventsRequest request;
  request.set_name(name);
  return Call(&Stub::ListJobEvents, request);
}

absl::StatusOr<::recfleet::v1::ListWorkersResponse> JobClient::ListWorkers() {
  return Call(&Stub::ListWorkers, ::recfleet::v1::ListWorkersRequest());
}

absl::Status JobClient::WatchJob(
    const std::string& name, bool include_progress,
    const std::function<void(const ::recfleet::v1::WatchJobResponse&)>& on_event) {
  grpc::ClientContext context;
  Prepare(&context, /*deadline=*/false);  // A watch lasts as long as the job.
  ::recfleet::v1::WatchJobRequest request;
  request.set_name(name);
  request.set_include_progress(include_progress);
  auto reader = stub_->WatchJob(&context, request);
  ::recfleet::v1::WatchJobResponse event;
  while (reader->Read(&event)) on_event(event);
  grpc::Status s = reader->Finish();
  return s.ok() ? absl::OkStatus() : Annotate(s, address_);
}

}  // namespace recfleet::cli
