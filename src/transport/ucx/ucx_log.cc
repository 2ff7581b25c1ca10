#include "transport/ucx/ucx_log.h"

#include <ucs/debug/log_def.h>

#include <cstdarg>
#include <cstdio>
#include <mutex>

#include "core/logging.h"

namespace kvferry::detail {
namespace {

constexpr size_t kMaxUcxLogLine = 1024;

spdlog::level::level_enum kvferry_level(ucs_log_level_t level) {
  switch (level) {
    case UCS_LOG_LEVEL_FATAL:
    case UCS_LOG_LEVEL_ERROR: return spdlog::level::err;
    case UCS_LOG_LEVEL_WARN: return spdlog::level::warn;
    case UCS_LOG_LEVEL_DIAG:
    case UCS_LOG_LEVEL_INFO: return spdlog::level::info;
    case UCS_LOG_LEVEL_DEBUG: return spdlog::level::debug;
    default: return spdlog::level::trace;
  }
}

ucs_log_func_rc_t to_kvferry_log(const char* file, unsigned line, const char* /*function*/,
                                 ucs_log_level_t level, const ucs_log_component_config_t* config,
                                 const char* format, va_list ap) {
  if (config != nullptr && level > config->log_level) return UCS_LOG_FUNC_RC_STOP;
  char message[kMaxUcxLogLine];
  va_list copy;
  va_copy(copy, ap);
  std::vsnprintf(message, sizeof(message), format, copy);
  va_end(copy);
  log().log(kvferry_level(level), "ucx {}:{}: {}", file != nullptr ? file : "?", line, message);
  return UCS_LOG_FUNC_RC_STOP;
}

}  // namespace

void install_ucx_log_handler() {
  static std::once_flag once;
  std::call_once(once, [] { ucs_log_push_handler(&to_kvferry_log); });
}

}  // namespace kvferry::detail
