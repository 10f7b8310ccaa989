#include "services/coordinator/job_service.h"

#include "services/coordinator/job_state.h"

namespace recfleet::coordinator {

using ::recfleet::v1::WatchJobResponse;

grpc::Status JobServiceImpl::CreateJob(grpc::ServerContext* context,
                                       const ::recfleet::v1::CreateJobRequest* request,
                                       ::recfleet::v1::Job* response) {
  return guard_->Run(*context, "CreateJob",
                     [&] { return FillResponse(coordinator_->CreateJob(*request), response); });
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context,
                                    const ::recfleet::v1::GetJobRequest* request,
                                    ::recfleet::v1::Job* response) {
  return guard_->Run(*context, "GetJob",
                     [&] { return FillResponse(coordinator_->GetJob(*request), response); });
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context,
                                      const ::recfleet::v1::ListJobsRequest* request,
                                      ::recfleet::v1::ListJobsResponse* response) {
  return guard_->Run(*context, "ListJobs",
                     [&] { return FillResponse(coordinator_->ListJobs(*request), response); });
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
                                       const ::recfleet::v1::CancelJobRequest* request,
                                       ::recfleet::v1::Job* response) {
  return guard_->Run(*context, "CancelJob",
                     [&] { return FillResponse(coordinator_->CancelJob(*request), response); });
}

grpc::Status JobServiceImpl::DeleteJob(grpc::ServerContext* context,
                                       const ::recfleet::v1::DeleteJobRequest* request,
                                       ::recfleet::v1::DeleteJobResponse* /*response*/) {
  return guard_->Run(*context, "DeleteJob", [&] { return coordinator_->DeleteJob(*request); });
}

grpc::Status JobServiceImpl::PlanJob(grpc::ServerContext* context,
                                     const ::recfleet::v1::PlanJobRequest* request,
                                     ::recfleet::v1::PlanJobResponse* response) {
  return guard_->Run(*context, "PlanJob",
                     [&] { return FillResponse(coordinator_->PlanJob(*request), response); });
}

grpc::Status JobServiceImpl::ListJobEvents(grpc::ServerContext* context,
                                           const ::recfleet::v1::ListJobEventsRequest* request,
                                           ::recfleet::v1::ListJobEventsResponse* response) {
  return guard_->Run(*context, "ListJobEvents",
                     [&] { return FillResponse(coordinator_->ListJobEvents(*request), response); });
}

grpc::Status JobServiceImpl::ListWorkers(grpc::ServerContext* context,
                                         const ::recfleet::v1::ListWorkersRequest* /*request*/,
                                         ::recfleet::v1::ListWorkersResponse* response) {
  return guard_->Run(*context, "ListWorkers", [&] {
    *response = coordinator_->ListWorkers();
    return absl::OkStatus();
  });
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context,
                                      const ::recfleet::v1::WatchJobRequest* request,
                                      grpc::ServerWriter<WatchJobResponse>* writer) {
  return guard_->Run(*context, "WatchJob", [&]() -> absl::Status {
    absl::StatusOr<Coordinator::JobEvent> snapshot = coordinator_->WatchSnapshot(request->name());
    if (!snapshot.ok()) return snapshot.status();
    if (!writer->Write(snapshot->second)) return absl::CancelledError("watcher went away");
    if (IsTerminal(snapshot->second.job().status().state())) return absl::OkStatus();
    int64_t after = snapshot->first;
    while (!context->IsCancelled()) {
      // Short waits so a cancelled client or a server shutdown is noticed.
      absl::StatusOr<std::vector<Coordinator::JobEvent>> events = coordinator_->WaitJobEvents(
          request->name(), after, absl::Now() + absl::Milliseconds(500));
      if (!events.ok()) return events.status();
      for (auto& [seq, event] : *events) {
        after = seq;
        if (event.kind() == WatchJobResponse::PROGRESS && !request->include_progress()) continue;
        if (!writer->Write(event)) return absl::CancelledError("watcher went away");
        if (IsTerminal(event.job().status().state())) return absl::OkStatus();
      }
    }
    return absl::CancelledError("watch cancelled");
  });
}

}  // namespace recfleet::coordinator
