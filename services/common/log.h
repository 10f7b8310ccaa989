#ifndef RECFLEET_SERVICES_COMMON_LOG_H_
#define RECFLEET_SERVICES_COMMON_LOG_H_

// Logging for recfleet's daemons: spdlog (Debian's libspdlog 1.10), one line
// per message on stderr, UTC timestamp, level letter and the process name:
//
//   2026-12-01T20:21:07.123456Z I recfleet-coordinator: serving on ...
//
// After InitLogging, log with spdlog's own calls and fmt-style arguments:
//
//   spdlog::warn("saving progress of {}: {}", name, status.message());
//
// Levels: trace, debug, info (the default), warn, error, critical. The
// SPDLOG_LEVEL environment variable overrides the level ("debug", or per
// logger "info,recfleet-worker=debug"). Lines a launcher reads on stdout
// (addresses, ids) stay plain printf output, not log lines.

#include <string>

namespace recfleet {

// Makes spdlog's default logger a stderr logger named `name` with the format
// above, at level info unless SPDLOG_LEVEL says otherwise; every line is
// flushed as it is written. Call once, first thing in main(); thread-safe
// logging afterwards.
void InitLogging(const std::string& name);

}  // namespace recfleet

#endif  // RECFLEET_SERVICES_COMMON_LOG_H_
