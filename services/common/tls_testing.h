#ifndef RECFLEET_SERVICES_COMMON_TLS_TESTING_H_
#define RECFLEET_SERVICES_COMMON_TLS_TESTING_H_

// Test certificates: runs deploy/tls/make-certs.sh (a data dependency of the
// test) into a fresh directory under $TEST_TMPDIR.

#include <string>

#include "absl/status/statusor.h"
#include "services/common/tls.h"

namespace recfleet::testing {

struct TestCerts {
  std::string dir;  // ca.pem, server.pem/.key, client.pem/.key
  std::string ca() const { return dir + "/ca.pem"; }
  std::string server_cert() const { return dir + "/server.pem"; }
  std::string server_key() const { return dir + "/server.key"; }
  std::string client_cert() const { return dir + "/client.pem"; }
  std::string client_key() const { return dir + "/client.key"; }

  // A server listening with this cluster's certificate (mutual TLS when
  // `require_client_cert`).
  TlsOptions Server(bool require_client_cert = false) const;
  // A client trusting this cluster's CA (presenting the client certificate
  // when `with_client_cert`).
  TlsOptions Client(bool with_client_cert = false) const;
};

// A new CA and its certificates in $TEST_TMPDIR/<name>.
absl::StatusOr<TestCerts> MakeTestCerts(const std::string& name);

}  // namespace recfleet::testing

#endif  // RECFLEET_SERVICES_COMMON_TLS_TESTING_H_
