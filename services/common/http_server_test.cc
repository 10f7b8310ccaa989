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
  absl::StatusOr<std::unique_ptr<HttpServer>> server =
      StartMetricsServer("127.0.0.1:0", &registry);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->address(), "127.0.0.1:" + std::to_string((*server)->port()));

  absl::StatusOr<HttpGetResult> got = HttpGet((*server)->address(), "/metrics?x=1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(got->content_type, "text/plain; version=0.0.4; charset=utf-8");
  absl::StatusOr<metrics::Exposition> e = metrics::ParseExposition(got->body);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->samples.at("recfleet_scraped_total"), 7);

  got = HttpGet((*server)->address(), "/healthz");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(got->body, "ok\n");

  got = HttpGet((*server)->address(), "/nothing");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status, 404);
}

TEST(HttpServerTest, RejectsOtherMethodsAndGarbage) {
  HttpServer server;
  server.Handle("/x", [] { return HttpServer::Response{200, "text/plain", "body"}; });
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  std::string post = RawRequest(server.port(), "POST /x HTTP/1.1\r\nHost: a\r\n\r\n");
  EXPECT_EQ(post.rfind("HTTP/1.1 405 ", 0), 0u) << post;
  std::string garbage = RawRequest(server.port(), "hello\r\n\r\n");
  EXPECT_EQ(garbage.rfind("HTTP/1.1 400 ", 0), 0u) << garbage;
  std::string head = RawRequest(server.port(), "HEAD /x HTTP/1.1\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200 ", 0), 0u) << head;
  EXPECT_NE(head.find("Content-Length: 4\r\n"), std::string::npos);
  EXPECT_EQ(head.find("body"), std::string::npos);
  // Still serving after bad clients.
  absl::StatusOr<HttpGetResult> got = HttpGet(server.address(), "/x");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->body, "body");
  server.Stop();
  server.Stop();
  EXPECT_FALSE(HttpGet(server.address(), "/x").ok());
}

TEST(HttpServerTest, BindErrorsNameTheAddress) {
  HttpServer first;
  ASSERT_TRUE(first.Start("127.0.0.1:0").ok());
  HttpServer second;
  absl::Status s = second.Start(first.address());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find(first.address()), std::string::npos) << s;
  HttpServer third;
  EXPECT_EQ(third.Start("9090").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recfleet
