#ifndef RECFLEET_SERVICES_COMMON_HTTP_SERVER_H_
#define RECFLEET_SERVICES_COMMON_HTTP_SERVER_H_

// A minimal HTTP/1.1 server for a service's operational endpoints
// (GET /metrics for Prometheus, GET /healthz for probes). It is not a general
// web server: GET and HEAD only, one request per connection
// (`Connection: close`), requests up to 8 KiB, served one at a time on one
// background thread; a client that does not send its request within 2 s is
// dropped so it cannot stall scrapes.
//
// Thread-safety: Handle() before Start(); Start/Stop from one owner thread;
// handlers run on the server thread and must be thread-safe w.r.t. the rest
// of the program.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/common/metrics.h"

namespace recfleet {

class HttpServer {
 public:
  struct Response {
    int status = 200;
    std::string content_type = "text/plain; charset=utf-8";
    std::string body;
  };
  using Handler = std::function<Response()>;

  HttpServer() = default;
  ~HttpServer();  // Stops the server.
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Serves GET `path` (exact match; the query string is ignored).
  void Handle(const std::string& path, Handler handler);

  // Binds `address` ("host:port"; port 0 = the OS picks) and starts serving.
  // Errors: INVALID_ARGUMENT (bad address), UNAVAILABLE (bind/listen failed,
  // with the OS reason).
  absl::Status Start(const std::string& address);

  // The bound port, after Start().
  int port() const { return port_; }
  // "host:port" with the bound port, after Start().
  const std::string& address() const { return address_; }

  // Stops accepting and joins the server thread. Idempotent.
  void Stop();

 private:
  void Serve();
  void ServeConnection(int fd);

  std::map<std::string, Handler> handlers_;
  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};  // Pipe: a byte wakes the thread to stop.
  int port_ = 0;
  std::string address_;
  std::thread thread_;
};

// Starts an HttpServer serving `registry` at /metrics (text format 0.0.4)
// and "ok" at /healthz.
absl::StatusOr<std::unique_ptr<HttpServer>> StartMetricsServer(const std::string& address,
                                                               const metrics::MetricRegistry* registry);

}  // namespace recfleet

#endif  // RECFLEET_SERVICES_COMMON_HTTP_SERVER_H_
