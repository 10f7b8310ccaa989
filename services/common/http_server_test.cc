#include "services/common/http_server.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"
#include "services/common/exposition.h"
#include "services/common/http_get.h"

namespace recfleet {
namespace {

// Sends raw bytes and returns the whole answer.
std::string RawRequest(int port, const std::string& request) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, n);
  ::close(fd);
  return out;
}

TEST(HttpServerTest, ServesMetricsAndHealthz) {
  metrics::MetricRegistry registry;
  registry.AddCounter("recfleet_scraped_total", "Test counter.").Get().Increment(7);
  auto& level = registry.AddGauge("recfleet_level", "Set by a collector.", {"recfleet_job", "rank"});
  int collected = 0;
  registry.AddCollector([&] { level.WithLabels({"jobs/a", "0"}).Set(++collected); });
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      StartMetricsServer("127.0.0.1:0", &registry);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->address(), "127.0.0.1:" + std::to_string((*server)->port()));

  absl::StatusOr<HttpGetResult> got = HttpGet((*server)->address(), "/metrics?x=1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(got->content_type.rfind("text/plain", 0), 0u) << got->content_type;
  absl::StatusOr<metrics::Exposition> e = metrics::ParseExposition(got->body);
  ASSERT_TRUE(e.ok()) << e.status() << "\n" << got->body;
  EXPECT_EQ(e->samples.at("recfleet_scraped_total"), 7);
  EXPECT_EQ(e->types.at("recfleet_scraped_total"), "counter");
  EXPECT_EQ(e->samples.at("recfleet_level{rank=\"0\",recfleet_job=\"jobs/a\"}"), 1);
  // Every scrape runs the collectors again.
  got = HttpGet((*server)->address(), "/metrics");
  ASSERT_TRUE(got.ok());
  e = metrics::ParseExposition(got->body);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->samples.at("recfleet_level{rank=\"0\",recfleet_job=\"jobs/a\"}"), 2);

  got = HttpGet((*server)->address(), "/healthz");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(got->body, "ok\n");

  got = HttpGet((*server)->address(), "/nothing");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status, 404);
}

TEST(HttpServerTest, SurvivesBadClientsAndStops) {
  metrics::MetricRegistry registry;
  registry.AddGauge("recfleet_up", "Up.").Get().Set(1);
  absl::StatusOr<std::unique_ptr<HttpServer>> server = StartMetricsServer("127.0.0.1:0", &registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::string garbage = RawRequest(port, "hello\r\n\r\n");
  EXPECT_EQ(garbage.rfind("HTTP/1.", 0), 0u) << garbage;
  EXPECT_NE(garbage.find(" 400 Bad Request\r\n"), std::string::npos) << garbage;
  std::string head = RawRequest(port, "HEAD /healthz HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200 ", 0), 0u) << head;
  EXPECT_NE(head.find("Content-Length: 3\r\n"), std::string::npos) << head;
  EXPECT_EQ(head.find("ok\n"), std::string::npos) << head;
  // Prometheus asks for gzip; the text compresses well.
  std::string gz = RawRequest(
      port, "GET /metrics HTTP/1.1\r\nHost: a\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n");
  EXPECT_NE(gz.find("Content-Encoding: gzip\r\n"), std::string::npos) << gz;
  // Still serving after bad clients.
  absl::StatusOr<HttpGetResult> got = HttpGet((*server)->address(), "/metrics");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_NE(got->body.find("recfleet_up 1\n"), std::string::npos) << got->body;
  const std::string address = (*server)->address();
  (*server)->Stop();
  (*server)->Stop();
  EXPECT_FALSE(HttpGet(address, "/metrics").ok());
}

TEST(HttpServerTest, OutlivesItsRegistry) {
  auto registry = std::make_unique<metrics::MetricRegistry>();
  registry->AddGauge("recfleet_gone", "Gone.").Get().Set(1);
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      StartMetricsServer("127.0.0.1:0", registry.get());
  ASSERT_TRUE(server.ok()) << server.status();
  registry.reset();
  absl::StatusOr<HttpGetResult> got = HttpGet((*server)->address(), "/metrics");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(got->body.find("recfleet_gone"), std::string::npos) << got->body;
}

TEST(HttpServerTest, BindErrorsNameTheAddress) {
  metrics::MetricRegistry registry;
  absl::StatusOr<std::unique_ptr<HttpServer>> first = StartMetricsServer("127.0.0.1:0", &registry);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<HttpServer>> second =
      StartMetricsServer((*first)->address(), &registry);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find((*first)->address()), std::string::npos)
      << second.status();
  EXPECT_EQ(StartMetricsServer("9090", &registry).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recfleet
