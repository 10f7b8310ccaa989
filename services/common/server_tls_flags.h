#ifndef RECFLEET_SERVICES_COMMON_SERVER_TLS_FLAGS_H_
#define RECFLEET_SERVICES_COMMON_SERVER_TLS_FLAGS_H_

// A gRPC server binary's TLS flags (services/common/tls.h): --tls_cert,
// --tls_key, --tls_client_ca, --insecure_plaintext.

#include "absl/flags/declare.h"
#include "services/common/tls.h"

ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, tls_client_ca);
ABSL_DECLARE_FLAG(bool, insecure_plaintext);

namespace recfleet {

TlsOptions ServerTlsOptionsFromFlags();

}  // namespace recfleet

#endif  // RECFLEET_SERVICES_COMMON_SERVER_TLS_FLAGS_H_
