#include "services/common/bearer_auth.h"

namespace recfleet {
namespace {

// Compares without an early exit, so response time does not reveal how
// many leading characters of a guess were right.
bool ConstantTimeEquals(const grpc::string_ref& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < b.size(); ++i) diff |= static_cast<unsigned char>(a.data()[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::Status BearerAuth::Check(const grpc::ServerContextBase& context) const {
  if (token_.empty()) return absl::OkStatus();
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return absl::UnauthenticatedError(
        "missing 'authorization: Bearer <token>' metadata; set RECFLEET_AUTH_TOKEN or "
        "--auth_token_file");
  }
  static constexpr char kPrefix[] = "Bearer ";
  const grpc::string_ref& value = it->second;
  if (value.size() < sizeof(kPrefix) - 1 ||
      std::string(value.data(), sizeof(kPrefix) - 1) != kPrefix) {
    return absl::UnauthenticatedError("authorization metadata must be 'Bearer <token>'");
  }
  grpc::string_ref token = value.substr(sizeof(kPrefix) - 1);
  if (!ConstantTimeEquals(token, token_)) {
    return absl::UnauthenticatedError("bearer token rejected");
  }
  return absl::OkStatus();
}

void AttachBearerToken(const std::string& token, grpc::ClientContext* context) {
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
}

}  // namespace recfleet
