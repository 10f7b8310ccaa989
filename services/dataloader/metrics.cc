#include "services/dataloader/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace recfleet::dataloader {

void LoaderMetrics::Rate::Add(int64_t now_s, double v) {
  int i = static_cast<int>(now_s % kBuckets);
  if (second[i] != now_s) {
    second[i] = now_s;
    sum[i] = 0;
  }
  sum[i] += v;
}

double LoaderMetrics::Rate::PerSecond(int64_t now_s) const {
  double total = 0;
  for (int i = 0; i < kBuckets; ++i) {
    // Complete seconds only: the current one is still filling.
    if (second[i] < now_s && second[i] >= now_s - (kBuckets - 1)) total += sum[i];
  }
  return total / (kBuckets - 1);
}

LoaderMetrics::LoaderMetrics() : start_(std::chrono::steady_clock::now()) {}

namespace {
int64_t Seconds(std::chrono::steady_clock::time_point start) {
  // Offset by one so that no real second collides with the zero-initialized buckets.
  return 1 + std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() -
                                                               start)
                 .count();
}
}  // namespace

void LoaderMetrics::RecordStep(double policy_gap, double naive_gap) {
  absl::MutexLock l(&mu_);
  ++steps_;
  last_gap_[0] = naive_gap;
  last_gap_[1] = policy_gap;
  gap_sum_[0] += naive_gap;
  gap_sum_[1] += policy_gap;
}

void LoaderMetrics::RecordSent(int rank, int64_t samples, int64_t bytes) {
  int64_t now = Seconds(start_);
  absl::MutexLock l(&mu_);
  samples_[rank] += samples;
  bytes_[rank] += bytes;
  sample_rate_.Add(now, static_cast<double>(samples));
  byte_rate_.Add(now, static_cast<double>(bytes));
}

void LoaderMetrics::SetQueueDepth(int rank, int depth) {
  absl::MutexLock l(&mu_);
  queue_depth_[rank] = depth;
}

std::string LoaderMetrics::PrometheusText() const {
  int64_t now = Seconds(start_);
  absl::MutexLock l(&mu_);
  std::string out;
  auto header = [&](const char* name, const char* type, const char* help) {
    absl::StrAppend(&out, "# HELP recfleet_dataloader_", name, " ", help, "\n# TYPE recfleet_dataloader_",
                    name, " ", type, "\n");
  };
  header("samples_total", "counter", "Samples sent to workers.");
  for (const auto& [rank, n] : samples_) {
    absl::StrAppend(&out, "recfleet_dataloader_samples_total{rank=\"", rank, "\"} ", n, "\n");
  }
  header("bytes_total", "counter", "Bytes of sample data sent to workers.");
  for (const auto& [rank, n] : bytes_) {
    absl::StrAppend(&out, "recfleet_dataloader_bytes_total{rank=\"", rank, "\"} ", n, "\n");
  }
  header("samples_per_second", "gauge", "Samples sent per second over the last 10 s.");
  absl::StrAppend(&out, "recfleet_dataloader_samples_per_second ", sample_rate_.PerSecond(now), "\n");
  header("bytes_per_second", "gauge", "Bytes sent per second over the last 10 s.");
  absl::StrAppend(&out, "recfleet_dataloader_bytes_per_second ", byte_rate_.PerSecond(now), "\n");
  header("steps_total", "counter", "Steps dealt.");
  absl::StrAppend(&out, "recfleet_dataloader_steps_total ", steps_, "\n");
  const char* dealing[2] = {"naive", "policy"};
  header("straggler_gap", "gauge",
         "Last step's max rank cost / mean - 1, before (naive) and after (policy) dealing.");
  for (int i = 0; i < 2; ++i) {
    absl::StrAppend(&out, "recfleet_dataloader_straggler_gap{dealing=\"", dealing[i], "\"} ",
                    last_gap_[i], "\n");
  }
  header("straggler_gap_sum", "counter", "Sum of per-step straggler gaps.");
  for (int i = 0; i < 2; ++i) {
    absl::StrAppend(&out, "recfleet_dataloader_straggler_gap_sum{dealing=\"", dealing[i], "\"} ",
                    gap_sum_[i], "\n");
  }
  header("straggler_gap_count", "counter", "Steps in straggler_gap_sum.");
  absl::StrAppend(&out, "recfleet_dataloader_straggler_gap_count ", steps_, "\n");
  header("queue_depth", "gauge", "Prefetched batches waiting to be sent, per rank.");
  for (const auto& [rank, d] : queue_depth_) {
    absl::StrAppend(&out, "recfleet_dataloader_queue_depth{rank=\"", rank, "\"} ", d, "\n");
  }
  return out;
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, std::function<std::string()> render) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("metrics: socket: ", std::strerror(errno)));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("metrics: host '", host, "' is not an IPv4 address"));
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0) {
    std::string err = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", host, ":", port, ": ", err));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(fd, ntohs(addr.sin_port), std::move(render)));
}

MetricsHttpServer::MetricsHttpServer(int fd, int port, std::function<std::string()> render)
    : fd_(fd), port_(port), render_(std::move(render)) {
  thread_ = std::thread([this] { Serve(); });
}

MetricsHttpServer::~MetricsHttpServer() {
  stop_ = true;
  shutdown(fd_, SHUT_RDWR);
  thread_.join();
  close(fd_);
}

void MetricsHttpServer::Serve() {
  while (!stop_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    timeval tv{2, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[2048];
    ssize_t n = recv(c, buf, sizeof(buf) - 1, 0);
    std::string req(buf, n > 0 ? n : 0);
    std::string body, status = "200 OK";
    if (req.rfind("GET /metrics ", 0) == 0 || req.rfind("GET /metrics?", 0) == 0) {
      body = render_();
    } else {
      status = "404 Not Found";
      body = "only /metrics is served here\n";
    }
    std::string resp = absl::StrCat("HTTP/1.0 ", status,
                                    "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: ",
                                    body.size(), "\r\nConnection: close\r\n\r\n", body);
    size_t off = 0;
    while (off < resp.size()) {
      ssize_t w = send(c, resp.data() + off, resp.size() - off, MSG_NOSIGNAL);
      if (w <= 0) break;
      off += w;
    }
    close(c);
  }
}

}  // namespace recfleet::dataloader
