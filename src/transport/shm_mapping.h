// Shared-memory pieces of the shm transport.
//
// ShmAllocation: memory this engine hands out with allocate_shared — a memfd named
// "kvferry:<engine>", mapped MAP_SHARED. Same-host peers get the memfd itself from this
// engine's ShmFdServer (SCM_RIGHTS over a Unix socket, transport/shm_fd_server.h).
//
// Guard page: the memfd has one page more than the user's bytes, after them, holding
// kShmGuardSlots 64-bit words. Each registration of a range inside the allocation claims a
// slot and writes a fresh generation into it; the descriptor tells peers the slot and the
// generation. Unregistering (or free_shared) zeroes the slot. A peer that mapped the memfd
// keeps its mapping (the owner cannot take it back), but it reads the word after every copy
// (and before posting): a word that no longer holds the generation of its descriptor means
// the range was unregistered, and the op fails with NotRegistered instead of completing into
// memory nobody reads. The check lives in the memory itself, so it holds however the peer
// obtained the fd.
//
// ShmMapping: this process's mapping of a peer's memfd. Before mapping, the file is
// checked to really be a kvferry memfd and at least as large as the descriptor claims, so
// a lying descriptor can make us neither map another file nor touch past its end.
//
// Thread-safety: both are immutable after creation; the mapping lives until the last
// shared_ptr (the peer's segment or an in-flight batch) lets go.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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
  // The user's bytes (a whole number of pages); the guard page follows them in the file.
  uint64_t bytes() const { return bytes_; }
  uint64_t file_bytes() const { return bytes_ + guard_bytes_; }
  uint64_t guard_offset() const { return bytes_; }
  int fd() const { return fd_.get(); }
  uint64_t inode() const { return inode_; }

  struct GuardClaim {
    uint32_t slot = 0;
    uint64_t generation = 0;
  };
  // A slot for a new registration, holding a generation never used in it before.
  // FailedPrecondition when kShmGuardSlots registrations of this allocation are live.
  // Not thread-safe: the engine's registry lock serialises claims and releases.
  Result<GuardClaim> claim_guard();
  // Zeroes the slot: peers' later ops to the registration fail.
  void release_guard(uint32_t slot);

 private:
  ShmAllocation(Fd fd, char* addr, uint64_t bytes, uint64_t guard_bytes, uint64_t inode);
  uint64_t* guard_word(uint32_t slot) const {
    return reinterpret_cast<uint64_t*>(addr_ + bytes_) + slot;
  }
  Fd fd_;
  char* addr_;
  uint64_t bytes_;
  uint64_t guard_bytes_;
  uint64_t inode_;
  std::vector<bool> slot_used_;
  uint64_t next_generation_ = 1;
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

// Registrations one allocation can hold at once: one page of 64-bit guard words.
inline constexpr uint32_t kShmGuardSlots = 512;
inline constexpr uint64_t kShmGuardBytes = uint64_t{kShmGuardSlots} * sizeof(uint64_t);

// Whether the guard word a peer's descriptor names still holds its generation (before
// posting an op).
inline bool shm_guard_holds(uint64_t* word, uint64_t generation) {
  return std::atomic_ref<uint64_t>(*word).load(std::memory_order_seq_cst) == generation;
}
// The same after a copy, as a read-modify-write that changes nothing: it is ordered after
// the copy's stores (a locked instruction on x86), and it precedes or follows the owner's
// zeroing store in the word's modification order, so "still holds" means the bytes were in
// place before the region was unregistered. (A fence and a load would do as well, but
// ThreadSanitizer does not model fences.)
inline bool shm_guard_held_after_copy(uint64_t* word, uint64_t generation) {
  return std::atomic_ref<uint64_t>(*word).fetch_or(0, std::memory_order_seq_cst) == generation;
}

// The memfd name prefix every kvferry shared allocation carries.
inline constexpr const char* kShmNamePrefix = "kvferry:";

}  // namespace kvferry
