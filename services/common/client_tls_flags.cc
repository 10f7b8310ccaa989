#include "services/common/client_tls_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate(s) that verify the coordinator and data loaders; TLS on when set");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate chain, for servers that require mutual TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");

namespace recfleet {

TlsOptions ClientTlsOptionsFromFlags() {
  TlsOptions o;
  o.ca_file = absl::GetFlag(FLAGS_tls_ca);
  o.cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.key_file = absl::GetFlag(FLAGS_tls_key);
  return o;
}

}  // namespace recfleet
