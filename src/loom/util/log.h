// Process-wide logging (spdlog): one-line messages to stderr, rank-prefixed when distributed.
#pragma once
#include <spdlog/spdlog.h>

namespace loom {

// Sets the log level from a name (trace, debug, info, warn, error) and the line prefix.
void configure_logging(const std::string& level, int rank = -1);

}  // namespace loom
