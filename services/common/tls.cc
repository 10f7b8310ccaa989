#include "services/common/tls.h"

#include <arpa/inet.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace recfleet {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, ": cannot read"));
  std::stringstream buf;
  buf << in.rdbuf();
  if (buf.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": not a PEM file (no '-----BEGIN' line)"));
  }
  return buf.str();
}

absl::Status CheckPair(const TlsOptions& o) {
  if (o.cert_file.empty() != o.key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together: give both or neither");
  }
  return absl::OkStatus();
}

}  // namespace

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

absl::StatusOr<ServerTransport> MakeServerTransport(const TlsOptions& options,
                                                    const std::string& listen_host) {
  if (absl::Status s = CheckPair(options); !s.ok()) return s;
  ServerTransport out;
  if (options.cert_file.empty()) {
    if (!options.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca needs the server's own --tls_cert and --tls_key");
    }
    if (IsLoopbackHost(listen_host)) {
      out.description = absl::StrCat(
          "plain text gRPC (no TLS) on loopback ", listen_host,
          ": for local demos only; pass --tls_cert and --tls_key to serve TLS");
    } else if (options.insecure_plaintext) {
      out.description = absl::StrCat(
          "WARNING: plain text gRPC (no TLS) on ", listen_host,
          " (--insecure_plaintext): bearer tokens and training data travel unencrypted");
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "refusing plain text gRPC on ", listen_host,
          ", which is not a loopback address: pass --tls_cert and --tls_key (deploy/tls/"
          "make-certs.sh makes them for a test cluster), or --insecure_plaintext to accept the "
          "risk"));
    }
    out.credentials = grpc::InsecureServerCredentials();
    return out;
  }
  absl::StatusOr<std::string> cert = ReadPem(options.cert_file, "tls_cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(options.key_file, "tls_key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  out.description = absl::StrCat("TLS (certificate ", options.cert_file, ")");
  if (!options.client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(options.client_ca_file, "tls_client_ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    out.description = absl::StrCat("mutual TLS (certificate ", options.cert_file,
                                   ", client certificates signed by ", options.client_ca_file, ")");
  }
  out.credentials = grpc::SslServerCredentials(ssl);
  out.tls = true;
  return out;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsOptions& options) {
  if (absl::Status s = CheckPair(options); !s.ok()) return s;
  if (options.ca_file.empty()) {
    if (!options.cert_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls_cert (a client certificate) needs --tls_ca, the CA that verifies the server");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions ssl;
  absl::StatusOr<std::string> ca = ReadPem(options.ca_file, "tls_ca");
  if (!ca.ok()) return ca.status();
  ssl.pem_root_certs = *ca;
  if (!options.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadPem(options.cert_file, "tls_cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem(options.key_file, "tls_key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace recfleet
