// Shared-memory pieces of the shm transport.
//
// ShmAllocation: memory this engine hands out with allocate_shared — a memfd named
// "kvferry:<engine>", mapped MAP_SHARED. Same-host peers reach it as /proc/<pid>/fd/<fd>.
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
  // Maps /proc/<pid>/fd/<fd> whole. PeerDisconnected when the process or fd is gone,
  // ProtocolError when the file is not a kvferry memfd or is smaller than `file_bytes`.
  static Result<std::shared_ptr<ShmMapping>> open(int64_t pid, int fd, uint64_t file_bytes,
                                                  uint64_t inode);
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;

  char* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  int peer_fd() const { return peer_fd_; }
  uint64_t inode() const { return inode_; }

 private:
  ShmMapping(char* base, uint64_t bytes, int peer_fd, uint64_t inode)
      : base_(base), bytes_(bytes), peer_fd_(peer_fd), inode_(inode) {}
  char* base_;
  uint64_t bytes_;
  int peer_fd_;
  uint64_t inode_;
};

// The memfd name prefix every kvferry shared allocation carries.
inline constexpr const char* kShmNamePrefix = "kvferry:";

}  // namespace kvferry
