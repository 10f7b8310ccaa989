#ifndef RECFLEET_SERVICES_COORDINATOR_LIST_FILTER_H_
#define RECFLEET_SERVICES_COORDINATOR_LIST_FILTER_H_

// ListJobsRequest.filter: the subset of AIP-160 recfleet supports, label
// equality joined by AND:
//
//   labels.team = "ranking" AND labels.owner = alice
//
// KEY is [A-Za-z0-9._/-]+; VALUE is a double-quoted string (backslash
// escapes a quote or a backslash) or, bare, [A-Za-z0-9._-]+. Whitespace around tokens is free; AND
// is upper case (AIP-160). Anything else is INVALID_ARGUMENT naming the
// column and what was expected, so a filter is never half understood.

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recfleet::coordinator {

// Label key -> required value; empty for an empty (or all-blank) filter.
absl::StatusOr<std::map<std::string, std::string>> ParseLabelFilter(absl::string_view filter);

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_LIST_FILTER_H_
