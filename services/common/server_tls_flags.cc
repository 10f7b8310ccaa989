#include "services/common/server_tls_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain this server presents; TLS on when set (with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA that must have signed every client's certificate (mutual TLS); empty = "
          "clients need no certificate");
ABSL_FLAG(bool, insecure_plaintext, false,
          "Serve plain text gRPC on an address that is not loopback (tokens and data "
          "unencrypted); without TLS flags only loopback addresses are allowed");

namespace recfleet {

TlsOptions ServerTlsOptionsFromFlags() {
  TlsOptions o;
  o.cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.key_file = absl::GetFlag(FLAGS_tls_key);
  o.client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  o.insecure_plaintext = absl::GetFlag(FLAGS_insecure_plaintext);
  return o;
}

}  // namespace recfleet
