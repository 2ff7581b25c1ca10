// Identity of "this host" as far as shared memory is concerned: the kernel boot id plus
// the pid namespace (a peer's memfd is reached through /proc/<pid>/fd, so both processes
// must see the same /proc). Two engines with equal host ids can use shm.
#pragma once

#include <string>

namespace kvferry {

// Computed once; thread-safe.
const std::string& host_identity();

}  // namespace kvferry
