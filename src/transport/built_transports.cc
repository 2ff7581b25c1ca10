#include "transport/built_transports.h"

#include "transport/cma/cma_transport.h"
#include "transport/local/local_transport.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#ifdef KVFERRY_WITH_CUDA
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/cuda_ipc/cuda_runtime_memory_api.h"
#endif
#ifdef KVFERRY_WITH_UCX
#include "transport/ucx/ucx_transport.h"
#endif

namespace kvferry {

std::vector<BuiltTransport> built_transports() {
  std::vector<BuiltTransport> built = {
      {TransportKind::kLocal, make_local_transport},
      {TransportKind::kShm, make_shm_transport},
      {TransportKind::kTcp, make_tcp_transport},
      {TransportKind::kCma, make_cma_transport},
  };
#ifdef KVFERRY_WITH_CUDA
  built.push_back({TransportKind::kCudaIpc, make_cuda_ipc_transport});
#endif
#ifdef KVFERRY_WITH_UCX
  built.push_back({TransportKind::kUcx, make_ucx_transport});
#endif
  return built;
}

CudaMemoryApiOpener built_cuda_memory_api_opener() {
  return []() -> Result<std::shared_ptr<CudaMemoryApi>> {
#ifdef KVFERRY_WITH_CUDA
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<CudaMemoryApi> api,
                         cuda_ipc::open_cuda_runtime_memory_api());
    return std::shared_ptr<CudaMemoryApi>(std::move(api));
#else
    return NotSupported("this build has no CUDA (built without the CUDA toolkit)");
#endif
  };
}

}  // namespace kvferry
