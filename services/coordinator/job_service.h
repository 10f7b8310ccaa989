#ifndef RECFLEET_SERVICES_COORDINATOR_JOB_SERVICE_H_
#define RECFLEET_SERVICES_COORDINATOR_JOB_SERVICE_H_

// gRPC adapter: recfleet.v1.JobService over Coordinator. Synchronous API:
// job calls are few, and a WatchJob stream holds one thread while it lasts.

#include "recfleet/v1/job_service.grpc.pb.h"
#include "services/common/rpc_guard.h"
#include "services/coordinator/coordinator.h"

namespace recfleet::coordinator {

class JobServiceImpl final : public ::recfleet::v1::JobService::Service {
 public:
  JobServiceImpl(Coordinator* coordinator, const RpcGuard* guard)
      : coordinator_(coordinator), guard_(guard) {}

  grpc::Status CreateJob(grpc::ServerContext* context,
                         const ::recfleet::v1::CreateJobRequest* request,
                         ::recfleet::v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const ::recfleet::v1::GetJobRequest* request,
                      ::recfleet::v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context,
                        const ::recfleet::v1::ListJobsRequest* request,
                        ::recfleet::v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context,
                         const ::recfleet::v1::CancelJobRequest* request,
                         ::recfleet::v1::Job* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context,
                         const ::recfleet::v1::DeleteJobRequest* request,
                         ::recfleet::v1::DeleteJobResponse* response) override;
  grpc::Status PlanJob(grpc::ServerContext* context,
                       const ::recfleet::v1::PlanJobRequest* request,
                       ::recfleet::v1::PlanJobResponse* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context,
                        const ::recfleet::v1::WatchJobRequest* request,
                        grpc::ServerWriter<::recfleet::v1::WatchJobResponse>* writer) override;
  grpc::Status ListJobEvents(grpc::ServerContext* context,
                             const ::recfleet::v1::ListJobEventsRequest* request,
                             ::recfleet::v1::ListJobEventsResponse* response) override;
  grpc::Status ListWorkers(grpc::ServerContext* context,
                           const ::recfleet::v1::ListWorkersRequest* request,
                           ::recfleet::v1::ListWorkersResponse* response) override;

 private:
  Coordinator* const coordinator_;
  const RpcGuard* const guard_;
};

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_JOB_SERVICE_H_
