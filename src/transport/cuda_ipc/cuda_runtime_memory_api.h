// The real CudaMemoryApi (transport/cuda_memory_api.h) over libcudart, for CUDA builds.
#pragma once

#include <memory>

#include "transport/cuda_memory_api.h"

namespace kvferry::cuda_ipc {

// NotSupported "no CUDA device: <runtime error>" when the runtime finds no usable device
// (no driver, no GPU).
Result<std::unique_ptr<CudaMemoryApi>> open_cuda_runtime_memory_api();

}  // namespace kvferry::cuda_ipc
