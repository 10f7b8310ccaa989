#include "services/common/http_get.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "services/common/address.h"

namespace recfleet {

absl::StatusOr<HttpGetResult> HttpGet(const std::string& address, const std::string& path,
                                      absl::Duration timeout) {
  absl::StatusOr<HostPort> hp = ParseHostPort(address, "HTTP address");
  if (!hp.ok()) return hp.status();
  httplib::Client client(hp->host, hp->port);
  const timeval tv = absl::ToTimeval(timeout);
  client.set_connection_timeout(tv.tv_sec, tv.tv_usec);
  client.set_read_timeout(tv.tv_sec, tv.tv_usec);
  client.set_write_timeout(tv.tv_sec, tv.tv_usec);
  httplib::Result res = client.Get(path);
  if (!res) {
    const std::string why = absl::StrCat("GET http://", address, path, ": ",
                                         httplib::to_string(res.error()));
    if (res.error() == httplib::Error::Read || res.error() == httplib::Error::Write) {
      return absl::DeadlineExceededError(why);
    }
    return absl::UnavailableError(why);
  }
  HttpGetResult out;
  out.status = res->status;
  out.content_type = res->get_header_value("Content-Type");
  out.body = res->body;
  return out;
}

}  // namespace recfleet
