#ifndef RECFLEET_SERVICES_COMMON_HTTP_GET_H_
#define RECFLEET_SERVICES_COMMON_HTTP_GET_H_

// A blocking HTTP/1.1 GET for operational endpoints (scraping /metrics in
// tests, benchmarks and scripts), on cpp-httplib's client: plain HTTP, no
// redirects followed, gzip answers decompressed.

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace recfleet {

struct HttpGetResult {
  int status = 0;
  std::string content_type;
  std::string body;
};

// GETs http://`address``path` ("127.0.0.1:9090", "/metrics"). Errors:
// INVALID_ARGUMENT (bad address), UNAVAILABLE (connect/read failed),
// DEADLINE_EXCEEDED (no full answer within `timeout`).
absl::StatusOr<HttpGetResult> HttpGet(const std::string& address, const std::string& path,
                                      absl::Duration timeout = absl::Seconds(5));

}  // namespace recfleet

#endif  // RECFLEET_SERVICES_COMMON_HTTP_GET_H_
