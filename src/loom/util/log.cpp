#include "loom/util/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "loom/util/errors.h"

namespace loom {

void configure_logging(const std::string& level, int rank) {
  auto logger = spdlog::get("loom");
  if (!logger) logger = spdlog::stderr_color_mt("loom");
  spdlog::set_default_logger(logger);
  auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off")
    throw ConfigError("tools.log_level: '" + level + "' is not one of trace, debug, info, warn, error, off");
  spdlog::set_level(parsed);
  std::string prefix = rank >= 0 ? "[rank " + std::to_string(rank) + "] " : "";
  spdlog::set_pattern(prefix + "%^%l%$: %v");
}

}  // namespace loom
