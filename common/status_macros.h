#ifndef RECFLEET_COMMON_STATUS_MACROS_H_
#define RECFLEET_COMMON_STATUS_MACROS_H_

// The one early-return macro for absl::Status in the repo (kernels, engine,
// planner, services). Header-only, depends on Abseil alone, so any library
// may use it without pulling in another component.

#include "absl/status/status.h"

// RECFLEET_RETURN_IF_ERROR(expr): returns the absl::Status `expr` from the
// enclosing function when it is not OK.
#define RECFLEET_RETURN_IF_ERROR(expr)         \
  do {                                         \
    const absl::Status _recfleet_s = (expr);   \
    if (!_recfleet_s.ok()) return _recfleet_s; \
  } while (0)

#endif  // RECFLEET_COMMON_STATUS_MACROS_H_
