#ifndef RECFLEET_SERVICES_COMMON_CLIENT_TLS_FLAGS_H_
#define RECFLEET_SERVICES_COMMON_CLIENT_TLS_FLAGS_H_

// The TLS flags of a binary that only calls gRPC servers (the worker):
// --tls_ca, --tls_cert, --tls_key (services/common/tls.h).

#include "absl/flags/declare.h"
#include "services/common/tls.h"

ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);

namespace recfleet {

TlsOptions ClientTlsOptionsFromFlags();

}  // namespace recfleet

#endif  // RECFLEET_SERVICES_COMMON_CLIENT_TLS_FLAGS_H_
