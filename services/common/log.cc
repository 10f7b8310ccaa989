#include "services/common/log.h"

#include <memory>

#include "spdlog/cfg/env.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace recfleet {

void InitLogging(const std::string& name) {
  // Plain (uncolored) stderr: daemon logs go to files and collectors.
  auto logger =
      std::make_shared<spdlog::logger>(name, std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %L %n: %v", spdlog::pattern_time_type::utc);
  logger->set_level(spdlog::level::info);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
  spdlog::cfg::load_env_levels();
}

}  // namespace recfleet
