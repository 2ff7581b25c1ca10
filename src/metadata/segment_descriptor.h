// SegmentDescriptor: what an engine tells its peers about itself — identity, the
// transports it serves, and every registered region with what a same-host peer needs to
// map it. Serialised as JSON at the metadata edge only; parse_segment_descriptor checks
// every field and bound, so a malformed or hostile descriptor is an error, never a crash.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvferry/status.h"
#include "kvferry/transfer_types.h"
#include "kvferry/transport_kind.h"

namespace kvferry {

// How a same-host peer reaches a region: the owner's memfd with this inode, which the peer
// asks for on the owner's shm socket (SegmentDescriptor::shm_socket), mapped whole; the region
// starts `file_offset` bytes into it. `fd` is the owner's descriptor number (informational).
// The 64-bit word at file offset `guard_offset + 8 * guard_slot` holds `generation` while
// the region is registered and something else once it is not (transport/shm_mapping.h): a
// peer checks it after every copy, so an op into memory unregistered meanwhile fails
// instead of completing.
struct ShmBacking {
  int fd = -1;
  uint64_t file_offset = 0;
  uint64_t file_bytes = 0;
  uint64_t inode = 0;  // identifies the memfd, so a reused fd number is never mistaken for it
  uint64_t guard_offset = 0;
  uint32_t guard_slot = 0;
  uint64_t generation = 0;  // never 0
};

// Bytes of a CUDA IPC memory handle (cudaIpcMemHandle_t; CUDA_IPC_HANDLE_SIZE). The CUDA
// build checks the runtime's type has this size.
inline constexpr size_t kCudaIpcHandleBytes = 64;
// Largest allocation a descriptor may claim (1 PiB): bounds the arithmetic on it.
inline constexpr uint64_t kMaxCudaAllocationBytes = uint64_t{1} << 50;

// How a same-host peer reaches device memory (cuda_ipc): an IPC handle for the whole
// allocation (cudaMalloc or a caching allocator's block) that contains the region, which
// starts `allocation_offset` bytes into it. The device is the region's location.
struct CudaIpcBacking {
  std::array<uint8_t, kCudaIpcHandleBytes> handle{};
  uint64_t allocation_offset = 0;
  uint64_t allocation_bytes = 0;
  friend bool operator==(const CudaIpcBacking&, const CudaIpcBacking&) = default;
};

// Bounds on what a descriptor may carry for ucx (UCX 1.13's packed rkeys are tens to a few
// hundred bytes, a worker address a few hundred per device; the bounds leave room for
// multi-rail hosts while keeping a hostile descriptor small).
inline constexpr size_t kMaxUcxRkeyBytes = 4096;
inline constexpr size_t kMaxUcxWorkerAddressBytes = 64u << 10;

// How a peer reaches this engine over UCX (the ucx transport).
struct UcxEndpoint {
  std::string worker_address;  // ucp_worker_get_address bytes (binary; hex in JSON)
  // UCX here has a hardware RMA transport (rc, dc, ud or another verbs one), whose NIC checks
  // rkey bounds; otherwise put/get are emulated by the target's software (tcp, shared memory).
  bool hardware_rma = false;
  friend bool operator==(const UcxEndpoint&, const UcxEndpoint&) = default;
};

struct RegionDescriptor {
  uint64_t addr = 0;
  uint64_t length = 0;
  MemoryLocation location{};
  std::optional<ShmBacking> shm;
  std::optional<CudaIpcBacking> cuda;  // only with a cuda location
  std::string ucx_rkey{};              // packed UCX rkey (binary; hex in JSON), or empty
  MemoryKind kind() const { return memory_kind_of(location, shm.has_value()); }
};

struct SegmentDescriptor {
  std::string name;
  std::string endpoint;         // "host:port" of the handshake listener
  std::string tcp_endpoint;     // "host:port" of the tcp data listener; empty if not served
  std::string notify_endpoint;  // "host:port" of the notification listener; empty: none
  // The abstract Unix socket that hands this engine's memfds to authorised same-host peers
  // (transport/shm_fd_server.h); empty when shm is not served.
  std::string shm_socket;
  // The abstract Unix socket over which this engine proves who it is to same-host peers and
  // declares the ranges they may reach with cma (transport/cma/cma_session.h); empty when
  // cma is not served.
  std::string cma_socket;
  uint64_t incarnation = 0;
  std::string host_id;  // see core/host_identity.h
  int64_t pid = 0;
  TransportSet transports;
  uint64_t version = 0;                   // bumped on every publish
  std::optional<UcxEndpoint> ucx;         // when the ucx transport is usable here
  std::vector<RegionDescriptor> regions;  // sorted by addr, non-overlapping
};

// Whether the peer advertises memory of this kind.
bool advertises(const SegmentDescriptor& descriptor, MemoryKind kind);

// Upper bounds a parser enforces; an engine refuses to register more regions than a peer
// would parse. A region takes 50-300 bytes of JSON (more for shm and cuda backings), so the
// byte bound holds the region bound's worth of any kind.
inline constexpr size_t kMaxDescriptorBytes = 64u << 20;
inline constexpr size_t kMaxDescriptorRegions = 1u << 18;
inline constexpr size_t kMaxShmSocketNameBytes = 100;  // either socket; below sun_path's 108

std::string serialize_segment_descriptor(const SegmentDescriptor& descriptor);
// The same with the regions given as their JSON array (`regions_json`, "[...]", written with
// append_region_json; descriptor.regions is not read): an engine writes its registered
// regions without first copying them all into descriptor.regions.
std::string serialize_segment_descriptor(const SegmentDescriptor& descriptor,
                                         std::string_view regions_json);
// Appends `region` as serialize_segment_descriptor writes it (a JSON object).
void append_region_json(std::string& out, const RegionDescriptor& region);
Result<SegmentDescriptor> parse_segment_descriptor(std::string_view json);

}  // namespace kvferry
