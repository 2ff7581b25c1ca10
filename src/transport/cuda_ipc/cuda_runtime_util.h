// Small helpers over the CUDA runtime shared by the cuda_ipc sources that include it.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include "kvferry/status.h"

namespace kvferry::cuda_ipc {

// "<call>: <error name> (<error string>)". Clears the runtime's last (non-sticky) error so
// it is not reported again by an unrelated call.
inline std::string cuda_error_text(std::string_view call, cudaError_t error) {
  cudaGetLastError();
  return std::string(call) + ": " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) +
         ")";
}

// Makes `device` current for a scope and restores the caller's device after: the engine
// runs CUDA calls on its users' threads and must not change their current device.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
    }
    status_ = previous_ == device ? cudaSuccess : cudaSetDevice(device);
  }
  ~ScopedDevice() {
    if (previous_ >= 0 && status_ == cudaSuccess) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace kvferry::cuda_ipc
