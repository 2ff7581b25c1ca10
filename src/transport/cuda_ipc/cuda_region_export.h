// export_cuda_region: the checks and the export behind registering device memory.
//
// A region registered as cuda:N must be device memory of device N, lying inside one
// allocation; what is published is an IPC handle of that whole allocation plus the
// region's offset in it (cudaIpcGetMemHandle works on allocations, and a caching
// allocator hands out sub-ranges of one). Errors name the region and what it really is.
//
// Thread-safety: as thread-safe as the CudaMemoryApi passed in.
#pragma once

#include <cstdint>

#include "kvferry/status.h"
#include "kvferry/transfer_types.h"
#include "metadata/segment_descriptor.h"
#include "transport/cuda_memory_api.h"

namespace kvferry::cuda_ipc {

// InvalidArgument when the memory is not what `location` says or spans allocations; the
// API's error when a query fails.
Result<CudaIpcBacking> export_cuda_region(CudaMemoryApi& api, void* addr, uint64_t length,
                                          MemoryLocation location);

}  // namespace kvferry::cuda_ipc
