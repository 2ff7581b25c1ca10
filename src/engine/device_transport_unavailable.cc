// The device transport of a build without CUDA: none. (With CUDA, the definitions are in
// src/transport/cuda_ipc/cuda_ipc_transport.cc.)
#ifndef KVFERRY_WITH_CUDA

#include "engine/device_transport.h"

namespace kvferry::detail {

bool device_transport_built() { return false; }

Result<std::unique_ptr<DeviceTransport>> open_device_transport() {
  return NotSupported(
      "this build has no CUDA support (configure with the CUDA toolkit and KVFERRY_CUDA=ON)");
}

}  // namespace kvferry::detail

#endif  // KVFERRY_WITH_CUDA
