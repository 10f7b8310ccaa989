#ifndef RECFLEET_SERVICES_COMMON_HTTP_SERVER_H_
#define RECFLEET_SERVICES_COMMON_HTTP_SERVER_H_

// A service's operational HTTP endpoint: GET /metrics for Prometheus (the
// registry rendered by prometheus-cpp's text serializer, gzip when the
// scraper asks for it) and GET /healthz ("ok") for probes; any other path
// answers 404. HTTP is cpp-httplib from Debian, on two threads of its own.
//
// Why not prometheus-cpp's own Exposer: it runs civetweb, whose Debian build
// starts threads with 100 KiB stacks, and glibc refuses such a thread in a
// process whose static TLS is larger (cuBLASLt alone holds 92 KiB of it).
//
// Thread-safety: Stop() from the owner thread; scrapes run on the server's
// threads and call the registry's collectors there.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "services/common/metrics.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace recfleet {

class HttpServer {
 public:
  ~HttpServer();  // Stops the server.
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound port.
  int port() const { return port_; }
  // "host:port" with the bound port.
  const std::string& address() const { return address_; }

  // Stops serving and joins the server's threads. Idempotent.
  void Stop();

 private:
  friend absl::StatusOr<std::unique_ptr<HttpServer>> StartMetricsServer(
      const std::string& address, const metrics::MetricRegistry* registry,
      const std::map<std::string, std::function<std::string()>>& pages);
  HttpServer();

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::string address_;
};

// Binds `address` ("host:port"; port 0 = the OS picks) and serves `registry`
// at /metrics and "ok" at /healthz. `registry` may be destroyed before the
// server: /metrics then serves an empty text. Errors: INVALID_ARGUMENT (bad
// address), UNAVAILABLE (bind/listen failed).
// `pages`: more GET paths (e.g. the coordinator's "/status"), each answered
// with the HTML its function renders, called on a server thread per request.
absl::StatusOr<std::unique_ptr<HttpServer>> StartMetricsServer(
    const std::string& address, const metrics::MetricRegistry* registry,
    const std::map<std::string, std::function<std::string()>>& pages = {});

}  // namespace recfleet

#endif  // RECFLEET_SERVICES_COMMON_HTTP_SERVER_H_
