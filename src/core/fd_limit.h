// The process's limit on open files. An engine holds about four descriptors per tcp peer (its
// lanes, the notification connection) and the PD layer one more per control link, so an
// engine talking to a few hundred peers passes the soft limit most systems start processes
// with (1024) long before the hard one. The first engine of a process raises the soft limit
// to the hard limit, as the Go runtime does (vLLM and sglang raise it to 65,535 at start-up),
// at most to kMaxRaisedOpenFiles (code that loops over every possible descriptor stays
// quick); it never lowers it and never touches the hard limit.
//
// Thread-safety: raise_open_files_limit may be called from any thread.
#pragma once

#include <cstdint>
#include <optional>

namespace kvferry {

inline constexpr uint64_t kMaxRaisedOpenFiles = uint64_t{1} << 20;

struct OpenFilesLimitChange {
  uint64_t from = 0;
  uint64_t to = 0;
};

// Raises RLIMIT_NOFILE's soft limit to min(hard limit, kMaxRaisedOpenFiles). The change when
// it raised it; nullopt when the soft limit is there already, or the kernel refused (the
// limits stay).
std::optional<OpenFilesLimitChange> raise_open_files_limit();

}  // namespace kvferry
