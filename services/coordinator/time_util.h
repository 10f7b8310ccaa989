#ifndef RECFLEET_SERVICES_COORDINATOR_TIME_UTIL_H_
#define RECFLEET_SERVICES_COORDINATOR_TIME_UTIL_H_

// absl::Time <-> google.protobuf.Timestamp / Duration.

#include "absl/time/time.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/timestamp.pb.h"

namespace recfleet::coordinator {

inline void ToProto(absl::Time t, google::protobuf::Timestamp* out) {
  const int64_t ns = absl::ToUnixNanos(t);
  out->set_seconds(ns / 1000000000);
  out->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

inline absl::Time FromProto(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

inline absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_TIME_UTIL_H_
