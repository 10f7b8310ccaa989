#include "services/common/data_grant.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace recfleet {
namespace {

// Deterministic, so the coordinator and the loader hash the same bytes for
// equal configs (map fields and unknown fields included).
std::string CanonicalBytes(const ::recfleet::v1::DataConfig& config) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    config.SerializeToCodedStream(&out);
  }
  // A domain prefix: a grant is never valid as another kind of signature
  // made with the same key.
  return absl::StrCat("recfleet.data_grant.v1", std::string(1, '\0'), bytes);
}

}  // namespace

std::string SignDataGrant(absl::string_view key, const ::recfleet::v1::DataConfig& config) {
  const std::string message = CanonicalBytes(config);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &mac_len);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(mac), mac_len));
}

absl::Status CheckDataGrant(absl::string_view key, const ::recfleet::v1::DataConfig& config,
                            absl::string_view grant) {
  if (grant.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat("no data_grant for ", config.job(),
                     ": this loader serves a job's data only with the grant its ranks receive "
                     "in their Assignment"));
  }
  const std::string expected = SignDataGrant(key, config);
  if (grant.size() != expected.size() ||
      CRYPTO_memcmp(grant.data(), expected.data(), expected.size()) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("data_grant is not the grant of ", config.job(),
                     "'s data configuration (another job's, or a changed configuration)"));
  }
  return absl::OkStatus();
}

}  // namespace recfleet
