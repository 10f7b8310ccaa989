#include "services/common/generic_call_testing.h"

#include <chrono>
#include <vector>

#include "grpcpp/generic/generic_stub.h"

namespace recfleet::testing {

grpc::Status GenericCall(const std::string& address, const std::string& method,
                         const std::string& request, std::string* response) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto call = stub.PrepareCall(&context, method, &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  grpc::Slice slice(request);
  grpc::ByteBuffer out(&slice, 1);
  call->Write(out, reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  call->WritesDone(reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  if (ok) {
    std::vector<grpc::Slice> slices;
    (void)in.Dump(&slices);
    for (const auto& s : slices) response->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  return status;
}

}  // namespace recfleet::testing
