// Shared-memory pieces of the shm transport.
//
// ShmAllocation: memory this engine hands out with allocate_shared — a memfd named
// "kvferry:<engine>", mapped MAP_SHARED. Same-host peers get the memfd itself from this
// engine's ShmFdServer (SCM_RIGHTS over a Unix socket, transport/shm_fd_server.h).
//
// ShmMapping: this process's mapping of a peer's memfd. Before mapping, the file is
// checked to really be a kvferry memfd and at least as large as the descriptor claims, so
// a lying descriptor can make us neither map another file nor touch past its end.
//
// Thread-safety: both are immutable after creation; the mapping lives until the last
// shared_ptr (the peer's segment or an in-flight batch) lets go.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/fd.h"
#include "kvferry/status.h"

namespace kvferry {

class ShmAllocation {
 public:
  static Result<std::unique_ptr<ShmAllocation>> create(const std::string& engine_name,
                                                       uint64_t bytes);
  ~ShmAllocation();
  ShmAllocation(const ShmAllocation&) = delete;
  ShmAllocation& operator=(const ShmAllocation&) = delete;

  char* addr() const { return addr_; }
  uint64_t bytes() const { return bytes_; }
  int fd() const { return fd_.get(); }
  uint64_t inode() const { return inode_; }

 private:
  ShmAllocation(Fd fd, char* addr, uint64_t bytes, uint64_t inode)
      : fd_(std::move(fd)), addr_(addr), bytes_(bytes), inode_(inode) {}
  Fd fd_;
  char* addr_;
  uint64_t bytes_;
  uint64_t inode_;
};

class ShmMapping {
 public:
  // Maps `file` (a peer's memfd, received over its shm socket) whole. `what` names it in
  // messages. PeerDisconnected when it is not the advertised inode, ProtocolError when the
  // file is not a kvferry memfd, is not sealed or is smaller than `file_bytes`.
  static Result<std::shared_ptr<ShmMapping>> open(Fd file, const std::string& what,
                                                  uint64_t file_bytes, uint64_t inode);
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  char* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t inode() const { return inode_; }

 private:
  ShmMapping(char* base, uint64_t bytes, uint64_t inode)
      : base_(base), bytes_(bytes), inode_(inode) {}
  char* base_;
  uint64_t bytes_;
  uint64_t inode_;
};

// The memfd name prefix every kvferry shared allocation carries.
inline constexpr const char* kShmNamePrefix = "kvferry:";

}  // namespace kvferry
