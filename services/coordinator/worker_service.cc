#include "services/coordinator/worker_service.h"

#include "services/common/rpc_status.h"

namespace recfleet::coordinator {

namespace {

// Runs a non-blocking handler and finishes the call at once.
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context, const RpcGuard* guard,
                                const char* method, const std::function<absl::Status()>& fn) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(guard->Run(*context, method, fn));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* WorkerServiceImpl::RegisterWorker(
    grpc::CallbackServerContext* context, const ::recfleet::v1::RegisterWorkerRequest* request,
    ::recfleet::v1::RegisterWorkerResponse* response) {
  return Unary(context, guard_, "RegisterWorker",
               [&] { return FillResponse(coordinator_->RegisterWorker(*request), response); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Heartbeat(
    grpc::CallbackServerContext* context, const ::recfleet::v1::HeartbeatRequest* request,
    ::recfleet::v1::HeartbeatResponse* response) {
  return Unary(context, guard_, "Heartbeat",
               [&] { return FillResponse(coordinator_->Heartbeat(*request), response); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportStep(
    grpc::CallbackServerContext* context, const ::recfleet::v1::ReportStepRequest* request,
    ::recfleet::v1::ReportStepResponse* response) {
  return Unary(context, guard_, "ReportStep",
               [&] { return FillResponse(coordinator_->ReportStep(*request), response); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvSet(grpc::CallbackServerContext* context,
                                                   const ::recfleet::v1::KvSetRequest* request,
                                                   ::recfleet::v1::KvSetResponse* response) {
  return Unary(context, guard_, "KvSet", [&] { return coordinator_->KvSet(*request); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvGet(grpc::CallbackServerContext* context,
                                                   const ::recfleet::v1::KvGetRequest* request,
                                                   ::recfleet::v1::KvGetResponse* response) {
  return Unary(context, guard_, "KvGet",
               [&] { return FillResponse(coordinator_->KvGet(*request), response); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::KvWait(grpc::CallbackServerContext* context,
                                                    const ::recfleet::v1::KvWaitRequest* request,
                                                    ::recfleet::v1::KvWaitResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  if (absl::Status auth = guard_->Authorize(*context); !auth.ok()) {
    guard_->Record("KvWait", auth.code(), start);
    reactor->Finish(ToGrpcStatus(auth));
    return reactor;
  }
  const RpcGuard* guard = guard_;
  coordinator_->KvWait(*request, [reactor, response, guard,
                                  start](absl::StatusOr<::recfleet::v1::KvWaitResponse> result) {
    if (result.ok()) *response = *std::move(result);
    guard->Record("KvWait", result.status().code(), start);
    reactor->Finish(ToGrpcStatus(result.status()));
  });
  return reactor;
}

}  // namespace recfleet::coordinator
