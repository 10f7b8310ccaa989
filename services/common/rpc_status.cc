#include "services/common/rpc_status.h"

#include <optional>
#include <string>

#include "absl/strings/cord.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"

namespace recfleet {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  google::rpc::Status details;
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
    google::protobuf::Any* any = details.add_details();
    any->set_type_url(std::string(url));
    any->set_value(std::string(payload));
  });
  if (details.details().empty()) {
    return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                        std::string(status.message()));
  }
  details.set_code(static_cast<int>(status.code()));
  details.set_message(std::string(status.message()));
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()),
                      details.SerializeAsString());
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  google::rpc::Status details;
  if (!status.error_details().empty() && details.ParseFromString(status.error_details())) {
    for (const google::protobuf::Any& any : details.details()) {
      out.SetPayload(any.type_url(), absl::Cord(any.value()));
    }
  }
  return out;
}

absl::Status BadRequestError(absl::string_view message,
                             const std::vector<FieldViolation>& violations) {
  google::rpc::BadRequest bad;
  for (const auto& [field, description] : violations) {
    google::rpc::BadRequest::FieldViolation* v = bad.add_field_violations();
    v->set_field(field);
    v->set_description(description);
  }
  absl::Status s = absl::InvalidArgumentError(message);
  s.SetPayload(kBadRequestTypeUrl, absl::Cord(bad.SerializeAsString()));
  return s;
}

std::vector<FieldViolation> FieldViolationsOf(const absl::Status& status) {
  std::vector<FieldViolation> out;
  const auto payload = status.GetPayload(kBadRequestTypeUrl);
  google::rpc::BadRequest bad;
  if (!payload || !bad.ParseFromString(std::string(*payload))) return out;
  for (const auto& v : bad.field_violations()) out.emplace_back(v.field(), v.description());
  return out;
}

}  // namespace recfleet
