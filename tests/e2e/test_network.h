#ifndef RECFLEET_TESTS_E2E_TEST_NETWORK_H_
#define RECFLEET_TESTS_E2E_TEST_NETWORK_H_

// A network of test "hosts" on this machine: each host is a network
// namespace with one interface (eth0, 192.0.2.<10 + i>/24, the documentation
// range RFC 5737 sets aside, never routed anywhere) joined by a veth pair to
// one bridge, which lives in a namespace of its own. Nothing touches the
// machine's own network namespace: no interface, route or address is added
// there, and no host of the test network can reach anything outside it.
//
// Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's `ip`; Create
// says plainly when either is missing. Namespaces are named
// "rfnet-<pid>-<host>"; the destructor deletes them, and Create deletes
// those left behind by processes that no longer exist.
//
// Not thread-safe; one test thread owns a network.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace recfleet::e2e {

class TestNetwork {
 public:
  // Hosts named `hosts`, in that order (addresses .10, .11, ...).
  // Errors: FAILED_PRECONDITION saying why namespaces, veth pairs or the
  // bridge cannot be made here, with the failing command and its output.
  static absl::StatusOr<std::unique_ptr<TestNetwork>> Create(const std::vector<std::string>& hosts);
  // Deletes the namespaces. End the processes running in them first.
  ~TestNetwork();

  // The host's address on the bridge.
  std::string Address(const std::string& host) const;
  // The argv prefix that runs a program in the host's namespace.
  std::vector<std::string> ExecPrefix(const std::string& host) const;
  // Moves the calling thread into the host's namespace; threads it starts
  // later (gRPC's included) are born there. Call before making channels.
  absl::Status Enter(const std::string& host);
  // Sets the host's cable at the bridge down (the host drops off the
  // network; its processes keep running) or up again.
  absl::Status SetLink(const std::string& host, bool up);

 private:
  TestNetwork() = default;
  int Index(const std::string& host) const;
  std::string Namespace(const std::string& host) const;

  std::string prefix_;  // "rfnet-<pid>-"
  std::vector<std::string> hosts_;
  std::vector<std::string> created_;  // Namespaces to delete.
};

}  // namespace recfleet::e2e

#endif  // RECFLEET_TESTS_E2E_TEST_NETWORK_H_
