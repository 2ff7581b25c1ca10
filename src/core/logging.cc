#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace kvferry {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("kvferry");
    l->set_pattern("[%H:%M:%S.%e] [%n] [%^%l%$] %v");
    const char* level = std::getenv("KVFERRY_LOG_LEVEL");
    l->set_level(level != nullptr ? spdlog::level::from_str(level) : spdlog::level::info);
    return l;
  }();
  return *logger;
}

}  // namespace kvferry
