#include "services/common/tls_testing.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace recfleet::testing {

TlsOptions TestCerts::Server(bool require_client_cert) const {
  TlsOptions o;
  o.cert_file = server_cert();
  o.key_file = server_key();
  if (require_client_cert) o.client_ca_file = ca();
  return o;
}

TlsOptions TestCerts::Client(bool with_client_cert) const {
  TlsOptions o;
  o.ca_file = ca();
  if (with_client_cert) {
    o.cert_file = client_cert();
    o.key_file = client_key();
  }
  return o;
}

absl::StatusOr<TestCerts> MakeTestCerts(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  TestCerts certs;
  certs.dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  const std::string command =
      absl::StrCat("deploy/tls/make-certs.sh '", certs.dir, "' --days 2 >/dev/null");
  if (int rc = std::system(command.c_str()); rc != 0) {
    return absl::InternalError(absl::StrCat("`", command, "` failed (", rc, ")"));
  }
  return certs;
}

}  // namespace recfleet::testing
