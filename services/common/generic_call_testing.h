#ifndef RECFLEET_SERVICES_COMMON_GENERIC_CALL_TESTING_H_
#define RECFLEET_SERVICES_COMMON_GENERIC_CALL_TESTING_H_

// Tests only: one request message and the first response message of any
// gRPC method (unary or streaming) by its full name, as raw serialized
// bytes, over a plain-text channel; for services whose generated stubs a
// test does not link (grpc.health.v1.Health, the reflection service).

#include <string>

#include "grpcpp/grpcpp.h"

namespace recfleet::testing {

// `method` is "/package.Service/Method"; *response gets the first response
// message (empty if none came). Deadline 5 s.
grpc::Status GenericCall(const std::string& address, const std::string& method,
                         const std::string& request, std::string* response);

}  // namespace recfleet::testing

#endif  // RECFLEET_SERVICES_COMMON_GENERIC_CALL_TESTING_H_
