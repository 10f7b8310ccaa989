#ifndef RECFLEET_SERVICES_COMMON_DATA_GRANT_H_
#define RECFLEET_SERVICES_COMMON_DATA_GRANT_H_

// Data grants: the coordinator's proof that a caller may read one job's data
// from a data loader. The coordinator and its loaders share a secret key;
// the grant of a DataConfig is HMAC-SHA256(key, the config's deterministic
// serialization), in hex. The coordinator puts it in each rank's Assignment,
// the worker sends it with every loader request, and the loader recomputes
// it for the DataConfig the request names. So a grant opens exactly one
// job's data configuration: another job's, or the same job with another
// dataset or rank count, needs another grant, which only the key holder can
// make (dataloader.proto, "Access").
//
// Thread-safe: free functions.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "recfleet/v1/dataloader.pb.h"

namespace recfleet {

// The grant of `config` under `key` (64 hex characters). `key` must not be
// empty.
std::string SignDataGrant(absl::string_view key, const ::recfleet::v1::DataConfig& config);

// OK when `grant` is SignDataGrant(key, config), compared in constant time.
// Errors: PERMISSION_DENIED naming the job, saying whether the grant was
// missing or is not this configuration's (never revealing the right one).
absl::Status CheckDataGrant(absl::string_view key, const ::recfleet::v1::DataConfig& config,
                            absl::string_view grant);

}  // namespace recfleet

#endif  // RECFLEET_SERVICES_COMMON_DATA_GRANT_H_
