#ifndef RECFLEET_SERVICES_COMMON_TLS_H_
#define RECFLEET_SERVICES_COMMON_TLS_H_

// Transport security of every recfleet gRPC server and client, built from
// PEM files named by flags (the same names in every binary):
//
//   server: --tls_cert, --tls_key   its certificate chain and private key;
//           --tls_client_ca         when set, clients must present a
//                                   certificate signed by it (mutual TLS)
//   client: --tls_ca                roots that verify the server; TLS is on
//                                   iff it is set
//           --tls_cert, --tls_key   the client certificate, for mutual TLS
//   both:   --insecure_plaintext    allows plain text on an address that is
//                                   not loopback
//
// Plain text stays for loopback demos: a server without a certificate that
// listens on a loopback address serves plain text and says so; on any other
// address it is refused unless --insecure_plaintext is given.
// `deploy/tls/make-certs.sh` makes a CA and certificates for a test cluster.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace recfleet {

// PEM file paths; empty = not given.
struct TlsOptions {
  std::string cert_file;
  std::string key_file;
  std::string ca_file;         // Client side: server roots.
  std::string client_ca_file;  // Server side: require client certificates.
  bool insecure_plaintext = false;
};

// What a server listens with, and a one-line description for its start-up
// message ("TLS", "mutual TLS", or the plain-text warning).
struct ServerTransport {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  bool tls = false;
  std::string description;
};

// True for "localhost", 127.0.0.0/8 and ::1 (not for 0.0.0.0 or "::").
bool IsLoopbackHost(const std::string& host);

// Server credentials for listening on `listen_host`. Errors:
// INVALID_ARGUMENT when only one of cert/key is given, a client CA without a
// certificate, an unreadable or empty file (named by its flag), or plain
// text on a non-loopback host without `insecure_plaintext`.
absl::StatusOr<ServerTransport> MakeServerTransport(const TlsOptions& options,
                                                    const std::string& listen_host);

// Channel credentials: TLS when `ca_file` is set (with the client
// certificate when cert/key are), plain text otherwise. Errors:
// INVALID_ARGUMENT for a certificate without its key (or the reverse), a
// certificate without a CA, an unreadable or empty file.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsOptions& options);

}  // namespace recfleet

#endif  // RECFLEET_SERVICES_COMMON_TLS_H_
