#include "transport/shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <string_view>

namespace kvferry {

Result<std::unique_ptr<ShmAllocation>> ShmAllocation::create(const std::string& engine_name,
                                                             uint64_t bytes) {
  if (bytes == 0) return InvalidArgument("allocate_shared: size 0");
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (bytes > (uint64_t{1} << 46)) {
    return InvalidArgument("allocate_shared: size " + std::to_string(bytes) + " is too large");
  }
  uint64_t rounded = (bytes + page - 1) / page * page;
  const uint64_t guard_bytes = (kShmGuardBytes + page - 1) / page * page;
  const uint64_t file_bytes = rounded + guard_bytes;
  std::string name = std::string(kShmNamePrefix) + engine_name;
  Fd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoStatus(StatusCode::kInternal, "memfd_create", errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(file_bytes)) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "ftruncate memfd to " + std::to_string(file_bytes),
                       errno);
  }
  // Sealed against shrinking: a peer that mapped it can never fault on a truncated page.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "seal memfd", errno);
  }
  void* addr =
      ::mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (addr == MAP_FAILED) {
    return ErrnoStatus(StatusCode::kInternal,
                       "mmap " + std::to_string(file_bytes) + " shared bytes", errno);
  }
  struct stat st {};
  ::fstat(fd.get(), &st);
  return std::unique_ptr<ShmAllocation>(new ShmAllocation(std::move(fd), static_cast<char*>(addr),
                                                          rounded, guard_bytes,
                                                          static_cast<uint64_t>(st.st_ino)));
}

ShmAllocation::ShmAllocation(Fd fd, char* addr, uint64_t bytes, uint64_t guard_bytes,
                             uint64_t inode)
    : fd_(std::move(fd)),
      addr_(addr),
      bytes_(bytes),
      guard_bytes_(guard_bytes),
      inode_(inode),
      slot_used_(kShmGuardSlots, false) {}

ShmAllocation::~ShmAllocation() {
  // Peers that still map the memfd see every registration of it gone.
  for (uint32_t slot = 0; slot < kShmGuardSlots; ++slot) release_guard(slot);
  ::munmap(addr_, file_bytes());
}

Result<ShmAllocation::GuardClaim> ShmAllocation::claim_guard() {
  for (uint32_t slot = 0; slot < kShmGuardSlots; ++slot) {
    if (slot_used_[slot]) continue;
    slot_used_[slot] = true;
    GuardClaim claim{slot, next_generation_++};
    std::atomic_ref<uint64_t>(*guard_word(slot)).store(claim.generation, std::memory_order_seq_cst);
    return claim;
  }
  return FailedPrecondition(
      "shared allocation at " + std::to_string(reinterpret_cast<uint64_t>(addr_)) +
      " already holds " + std::to_string(kShmGuardSlots) + " registrations; unregister some first");
}

void ShmAllocation::release_guard(uint32_t slot) {
  if (slot >= kShmGuardSlots) return;
  slot_used_[slot] = false;
  std::atomic_ref<uint64_t>(*guard_word(slot)).store(0, std::memory_order_seq_cst);
}

Result<std::shared_ptr<ShmMapping>> ShmMapping::open(Fd file, const std::string& what,
                                                     uint64_t file_bytes, uint64_t inode) {
  const std::string& path = what;
  // Our own view of the file tells what it really is.
  std::array<char, 256> target{};
  std::string self = "/proc/self/fd/" + std::to_string(file.get());
  ssize_t n = ::readlink(self.c_str(), target.data(), target.size() - 1);
  std::string_view name(target.data(), n > 0 ? static_cast<size_t>(n) : 0);
  if (!name.starts_with(std::string("/memfd:") + kShmNamePrefix)) {
    return ProtocolError("peer descriptor points at " + path + " which is '" + std::string(name) +
                         "', not a kvferry shared allocation");
  }
  struct stat st {};
  if (::fstat(file.get(), &st) != 0)
    return ErrnoStatus(StatusCode::kInternal, "fstat " + path, errno);
  if (static_cast<uint64_t>(st.st_ino) != inode) {
    return PeerDisconnected("peer shared memory " + path + " was replaced (inode " +
                            std::to_string(st.st_ino) + ", expected " + std::to_string(inode) +
                            ")");
  }
  if (static_cast<uint64_t>(st.st_size) < file_bytes) {
    return ProtocolError("peer shared memory " + path + " has " + std::to_string(st.st_size) +
                         " bytes, descriptor claims " + std::to_string(file_bytes));
  }
  int seals = ::fcntl(file.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return ProtocolError("peer shared memory " + path + " is not sealed against shrinking");
  }
  void* base =
      ::mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, file.get(), 0);
  if (base == MAP_FAILED) return ErrnoStatus(StatusCode::kInternal, "mmap " + path, errno);
  return std::shared_ptr<ShmMapping>(
      new ShmMapping(static_cast<char*>(base), file_bytes, static_cast<uint64_t>(st.st_ino)));
}

ShmMapping::~ShmMapping() { ::munmap(base_, bytes_); }

}  // namespace kvferry
