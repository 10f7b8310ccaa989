#ifndef RECFLEET_SERVICES_COMMON_ADDRESS_H_
#define RECFLEET_SERVICES_COMMON_ADDRESS_H_

// "host:port" addresses as the services' flags take them.

#include <string>

#include "absl/status/statusor.h"

namespace recfleet {

struct HostPort {
  std::string host;  // Without brackets for IPv6 ("::1").
  int port = 0;      // 0 = let the OS pick when listening.
};

// Parses "host:port", "[v6addr]:port". The host must be non-empty and the
// port 0..65535. `what` names the flag or field in the error message
// ("--metrics_address must be host:port, got '9090'").
absl::StatusOr<HostPort> ParseHostPort(const std::string& address, const std::string& what);

// The inverse: brackets an IPv6 host.
std::string FormatHostPort(const std::string& host, int port);

}  // namespace recfleet

#endif  // RECFLEET_SERVICES_COMMON_ADDRESS_H_
