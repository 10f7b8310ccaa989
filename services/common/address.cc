#include "services/common/address.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace recfleet {

absl::StatusOr<HostPort> ParseHostPort(const std::string& address, const std::string& what) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be host:port (", why, "), got '",
                                                   address, "'"));
  };
  HostPort out;
  std::string port;
  if (!address.empty() && address[0] == '[') {
    size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return bad("IPv6 hosts are written [addr]:port");
    }
    out.host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    size_t colon = address.rfind(':');
    if (colon == std::string::npos) return bad("missing ':port'");
    out.host = address.substr(0, colon);
    if (out.host.find(':') != std::string::npos) return bad("IPv6 hosts are written [addr]:port");
    port = address.substr(colon + 1);
  }
  if (out.host.empty()) return bad("missing host");
  if (!absl::SimpleAtoi(port, &out.port) || out.port < 0 || out.port > 65535) {
    return bad("port must be 0..65535");
  }
  return out;
}

std::string FormatHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

}  // namespace recfleet
