// choose_transport: the one table that picks the transport for a peer, as a pure function
// so tests pin it down.
//
//   forced kind          -> that kind if it can reach the peer, else NotSupported saying why
//   self                 -> local (handled by the caller)
//   same host, the peer advertises device memory, both serve cuda_ipc, a device is usable
//                        -> cuda_ipc
//   same host, both serve shm, every host region of the peer is shareable (allocate_shared)
//                                                  -> shm
//   both serve tcp and the peer has a tcp endpoint -> tcp
//   same host, both serve shm                      -> shm (its private regions refused per op)
//   otherwise                                      -> NotSupported listing why each failed
//
// A peer with device memory that cuda_ipc cannot reach (no device here, another host) gets
// the next transport; its ops to device memory are then refused naming the reason
// (nothing moves silently through a slower path).
//
// Thread-safety: pure; `device_usable` is called at most once, only when cuda_ipc is
// considered.
#pragma once

#include <functional>
#include <optional>

#include "kvferry/status.h"
#include "kvferry/transport_kind.h"
#include "metadata/segment_descriptor.h"

namespace kvferry::detail {

struct TransportChoiceInput {
  TransportSet served;  // by this engine
  bool same_host = false;
  bool is_self = false;
  std::optional<TransportKind> forced;
  // OK when this process can make device copies, else why not. Evaluated lazily: asking
  // initialises CUDA.
  std::function<Status()> device_usable;
};

Result<TransportKind> choose_transport(const SegmentDescriptor& peer,
                                       const TransportChoiceInput& input);

// Whether the peer advertises device memory it exported for IPC.
bool advertises_device_memory(const SegmentDescriptor& peer);

}  // namespace kvferry::detail
