#include "services/common/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "prometheus/text_serializer.h"
#include "services/common/address.h"

namespace recfleet {

HttpServer::HttpServer() : server_(std::make_unique<httplib::Server>()) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

absl::StatusOr<std::unique_ptr<HttpServer>> StartMetricsServer(
    const std::string& address, const metrics::MetricRegistry* registry,
    const std::map<std::string, std::function<std::string()>>& pages) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address, "HTTP listen address");
  if (!hp.ok()) return hp.status();
  std::unique_ptr<HttpServer> s(new HttpServer());
  httplib::Server& server = *s->server_;
  // Scrapes and probes are few; two threads leave room for a slow client.
  server.new_task_queue = [] { return new httplib::ThreadPool(2); };
  // One request per connection, and a client that does not send its request
  // within 2 s is dropped, so no idle client holds a thread a scrape needs.
  server.set_keep_alive_max_count(1);
  server.set_read_timeout(2, 0);
  server.set_write_timeout(2, 0);
  // cpp-httplib's default also sets SO_REUSEPORT, which would let a second
  // process bind a port in use and take half its scrapes.
  server.set_socket_options([](int fd) {
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  });
  std::weak_ptr<prometheus::Collectable> collectable = registry->collectable();
  server.Get("/metrics", [collectable](const httplib::Request&, httplib::Response& res) {
    std::string text;
    if (std::shared_ptr<prometheus::Collectable> c = collectable.lock()) {
      text = prometheus::TextSerializer().Serialize(c->Collect());
    }
    res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
  });
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain; charset=utf-8");
  });
  for (const auto& [path, render] : pages) {
    server.Get(path, [render = render](const httplib::Request&, httplib::Response& res) {
      res.set_content(render(), "text/html; charset=utf-8");
    });
  }
  if (hp->port == 0) {
    s->port_ = server.bind_to_any_port(hp->host);
  } else if (server.bind_to_port(hp->host, hp->port)) {
    s->port_ = hp->port;
  }
  if (s->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address, " (address in use, or not an address of this machine)"));
  }
  s->address_ = FormatHostPort(hp->host, s->port_);
  s->thread_ = std::thread([&server] { server.listen_after_bind(); });
  // stop() is a no-op until the accept loop runs, and Stop() must not miss
  // it; connections made meanwhile wait in the listen backlog.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!server.is_running() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  return s;
}

}  // namespace recfleet
