#ifndef RECFLEET_PLANNER_UNITS_H_
#define RECFLEET_PLANNER_UNITS_H_

// How the planner prints quantities in explanations and reports.

#include <string>

#include "absl/strings/str_format.h"

namespace recfleet::planner {

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// "12.34 GiB".
inline std::string GiBText(double bytes) { return absl::StrFormat("%.2f GiB", bytes / kGiB); }
// "1.234 ms".
inline std::string MsText(double seconds) { return absl::StrFormat("%.3f ms", seconds * 1e3); }

}  // namespace recfleet::planner

#endif  // RECFLEET_PLANNER_UNITS_H_
