#ifndef RECFLEET_SERVICES_COORDINATOR_WORKER_SERVICE_H_
#define RECFLEET_SERVICES_COORDINATOR_WORKER_SERVICE_H_

// gRPC adapter: recfleet.v1.WorkerService over Coordinator. Callback API:
// heartbeats from thousands of workers are handled without a thread each,
// and a KvWait parks no thread while it waits.

#include "recfleet/v1/worker_service.grpc.pb.h"
#include "services/common/rpc_guard.h"
#include "services/coordinator/coordinator.h"

namespace recfleet::coordinator {

class WorkerServiceImpl final : public ::recfleet::v1::WorkerService::CallbackService {
 public:
  WorkerServiceImpl(Coordinator* coordinator, const RpcGuard* guard)
      : coordinator_(coordinator), guard_(guard) {}

  grpc::ServerUnaryReactor* RegisterWorker(
      grpc::CallbackServerContext* context, const ::recfleet::v1::RegisterWorkerRequest* request,
      ::recfleet::v1::RegisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const ::recfleet::v1::HeartbeatRequest* request,
                                      ::recfleet::v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* ReportStep(grpc::CallbackServerContext* context,
                                       const ::recfleet::v1::ReportStepRequest* request,
                                       ::recfleet::v1::ReportStepResponse* response) override;
  grpc::ServerUnaryReactor* KvSet(grpc::CallbackServerContext* context,
                                  const ::recfleet::v1::KvSetRequest* request,
                                  ::recfleet::v1::KvSetResponse* response) override;
  grpc::ServerUnaryReactor* KvGet(grpc::CallbackServerContext* context,
                                  const ::recfleet::v1::KvGetRequest* request,
                                  ::recfleet::v1::KvGetResponse* response) override;
  grpc::ServerUnaryReactor* KvWait(grpc::CallbackServerContext* context,
                                   const ::recfleet::v1::KvWaitRequest* request,
                                   ::recfleet::v1::KvWaitResponse* response) override;

 private:
  Coordinator* const coordinator_;
  const RpcGuard* const guard_;
};

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_WORKER_SERVICE_H_
