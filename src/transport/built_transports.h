// built_transports: the transports compiled into this build, each with its factory. The one
// place that names every concrete transport (built_transports.cc); the engine creates the
// ones it serves from this list and knows them only through transport.h.
#pragma once

#include <vector>

#include "transport/cuda_memory_api.h"
#include "transport/transport.h"

namespace kvferry {

struct BuiltTransport {
  TransportKind kind;
  TransportFactory create;
};

std::vector<BuiltTransport> built_transports();

// Opens this build's CUDA runtime API (TransportEnv::open_cuda_api): the real one in a CUDA
// build, NotSupported otherwise.
CudaMemoryApiOpener built_cuda_memory_api_opener();

}  // namespace kvferry
