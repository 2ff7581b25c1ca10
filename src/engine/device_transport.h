// DeviceTransport: what the engine needs from a GPU copy backend (today cuda_ipc), behind
// an interface free of CUDA headers, so the engine builds the same with or without CUDA.
//
// Contract (the engine relies on each point):
//  * export_region checks that [addr, +length) is memory of `location` (device memory of
//    cuda:N) and returns what a same-host peer needs to map it: an IPC handle of the
//    allocation that contains it and the region's offset in that allocation.
//  * post takes a resolved batch whose spans may name a peer's device memory by address
//    only (ResolvedOp::remote == null), opens the IPC handles it needs (cached per peer
//    incarnation), enqueues every copy on the device with no CPU thread blocking, and
//    returns. Each batch then ends through BatchRecord::finish_task, called by the
//    backend's completion thread once the copies are done on the device. An error before
//    anything is enqueued is returned and the batch was never started.
//  * While a batch's copies are enqueued, BatchRecord::wire_in_flight is non-zero, so
//    stop() waits for them (until the batch deadline) before declaring the batch final.
//  * forget_peer drops the handles opened for a peer incarnation (the peer restarted or was
//    closed); batches still using them keep them open until they end.
//
// Thread-safety: every method may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/batch_record.h"
#include "engine/region_index.h"
#include "kvferry/status.h"
#include "kvferry/transfer_engine.h"
#include "metadata/segment_descriptor.h"

namespace kvferry::detail {

struct DevicePostContext {
  const RegionIndex* local = nullptr;
  const RegionIndex* remote = nullptr;  // the peer's regions (the local ones for the self peer)
  uint64_t peer_incarnation = 0;
  void* after_cuda_event = nullptr;  // SubmitOptions::after_cuda_event
};

class DeviceTransport {
 public:
  virtual ~DeviceTransport() = default;
  virtual Result<CudaIpcBacking> export_region(void* addr, uint64_t length,
                                               MemoryLocation location) = 0;
  virtual Status post(const std::shared_ptr<BatchRecord>& batch,
                      const DevicePostContext& context) = 0;
  virtual void forget_peer(uint64_t incarnation) = 0;
};

// True when this build contains a device transport (configured with CUDA).
bool device_transport_built();

// Opens the device transport: NotSupported naming why when the build has none or no
// device is usable ("no CUDA device: <runtime error>").
Result<std::unique_ptr<DeviceTransport>> open_device_transport();

}  // namespace kvferry::detail
