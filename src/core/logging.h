// The kvferry logger (spdlog). The only global mutable state in the library.
// Level from KVFERRY_LOG_LEVEL (trace, debug, info, warn, error, off); default info.
#pragma once

#include <spdlog/spdlog.h>

namespace kvferry {

// Thread-safe; created on first use.
spdlog::logger& log();

}  // namespace kvferry
