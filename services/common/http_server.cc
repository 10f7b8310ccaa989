#include "services/common/http_server.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/common/address.h"

namespace recfleet {
namespace {

constexpr size_t kMaxRequestBytes = 8192;

const char* StatusText(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 500: return "Internal Server Error";
    default: return "Unknown";
  }
}

void WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // The client went away; nothing to tell it.
    done += static_cast<size_t>(n);
  }
}

}  // namespace

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Handle(const std::string& path, Handler handler) {
  handlers_[path] = std::move(handler);
}

absl::Status HttpServer::Start(const std::string& address) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address, "HTTP listen address");
  if (!hp.ok()) return hp.status();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(hp->port);
  if (int rc = ::getaddrinfo(hp->host.c_str(), port_str.c_str(), &hints, &res); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve host of '", address, "': ", gai_strerror(rc)));
  }
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      listen_fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (listen_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", last_error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6
                    ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                    : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  address_ = FormatHostPort(hp->host, port_);
  if (::pipe2(wake_fds_, O_CLOEXEC) != 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  thread_ = std::thread([this] { Serve(); });
  return absl::OkStatus();
}

void HttpServer::Stop() {
  if (!thread_.joinable()) return;
  char b = 1;
  (void)!::write(wake_fds_[1], &b, 1);
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_fds_[0]);
  ::close(wake_fds_[1]);
  listen_fd_ = wake_fds_[0] = wake_fds_[1] = -1;
}

void HttpServer::Serve() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fds_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    ServeConnection(fd);
    ::close(fd);
  }
}

void HttpServer::ServeConnection(int fd) {
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  std::string request;
  char buf[2048];
  while (request.find("\r\n\r\n") == std::string::npos) {
    if (request.size() > kMaxRequestBytes) break;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // Timed out or closed before a full request.
    request.append(buf, static_cast<size_t>(n));
  }
  Response response;
  bool head = false;
  std::vector<std::string> line = absl::StrSplit(request.substr(0, request.find("\r\n")), ' ');
  if (request.find("\r\n\r\n") == std::string::npos || line.size() != 3 ||
      line[2].rfind("HTTP/1.", 0) != 0) {
    response = {400, "text/plain; charset=utf-8", "malformed HTTP/1.x request\n"};
  } else if (line[0] != "GET" && line[0] != "HEAD") {
    response = {405, "text/plain; charset=utf-8", "only GET and HEAD are served\n"};
  } else {
    head = line[0] == "HEAD";
    std::string path = line[1].substr(0, line[1].find('?'));
    auto it = handlers_.find(path);
    if (it == handlers_.end()) {
      response = {404, "text/plain; charset=utf-8", absl::StrCat("no handler for ", path, "\n")};
    } else {
      response = it->second();
    }
  }
  std::string out = absl::StrCat("HTTP/1.1 ", response.status, " ", StatusText(response.status),
                                 "\r\nContent-Type: ", response.content_type,
                                 "\r\nContent-Length: ", response.body.size(),
                                 "\r\nConnection: close\r\n\r\n");
  if (!head) out += response.body;
  WriteAll(fd, out);
}

absl::StatusOr<std::unique_ptr<HttpServer>> StartMetricsServer(
    const std::string& address, const metrics::MetricRegistry* registry) {
  auto server = std::make_unique<HttpServer>();
  server->Handle("/metrics", [registry] {
    return HttpServer::Response{200, "text/plain; version=0.0.4; charset=utf-8",
                                registry->Render()};
  });
  server->Handle("/healthz", [] { return HttpServer::Response{200, "text/plain", "ok\n"}; });
  absl::Status status = server->Start(address);
  if (!status.ok()) return status;
  return server;
}

}  // namespace recfleet
