#include "services/common/http_get.h"

#include <errno.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/common/address.h"

namespace recfleet {

absl::StatusOr<HttpGetResult> HttpGet(const std::string& address, const std::string& path,
                                      absl::Duration timeout) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address, "HTTP address");
  if (!hp.ok()) return hp.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(hp->host.c_str(), std::to_string(hp->port).c_str(), &hints, &res);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", address, ": ", gai_strerror(rc)));
  }
  int fd = -1;
  std::string error = "no address";
  timeval tv = absl::ToTimeval(timeout);
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      error = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("connect to ", address, ": ", error));

  std::string request = absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: ", address,
                                     "\r\nConnection: close\r\n\r\n");
  std::string response;
  bool ok = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(request.size());
  char buf[16384];
  while (ok) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      if (err == EAGAIN || err == EWOULDBLOCK) {
        return absl::DeadlineExceededError(absl::StrCat("GET ", address, path, " timed out"));
      }
      return absl::UnavailableError(absl::StrCat("read from ", address, ": ", std::strerror(err)));
    }
    if (n == 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (!ok) return absl::UnavailableError(absl::StrCat("send to ", address, " failed"));

  size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::DataLossError(absl::StrCat("GET ", address, path, ": response has no header end"));
  }
  std::vector<std::string> lines = absl::StrSplit(response.substr(0, header_end), "\r\n");
  std::vector<std::string> status_line = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  HttpGetResult result;
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &result.status)) {
    return absl::DataLossError(absl::StrCat("bad HTTP status line '", lines[0], "'"));
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    if (absl::AsciiStrToLower(lines[i].substr(0, colon)) == "content-type") {
      result.content_type = std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    }
  }
  result.body = response.substr(header_end + 4);
  return result;
}

}  // namespace recfleet
