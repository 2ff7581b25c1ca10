#include "core/fd_limit.h"

#include <sys/resource.h>

#include <algorithm>

namespace kvferry {

std::optional<OpenFilesLimitChange> raise_open_files_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return std::nullopt;
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= limit.rlim_max) return std::nullopt;
  const rlim_t to = std::min<rlim_t>(limit.rlim_max, kMaxRaisedOpenFiles);
  if (limit.rlim_cur >= to) return std::nullopt;
  const OpenFilesLimitChange change{limit.rlim_cur, to};
  limit.rlim_cur = to;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) return std::nullopt;
  return change;
}

}  // namespace kvferry
