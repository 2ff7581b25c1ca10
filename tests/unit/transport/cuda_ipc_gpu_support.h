// Support for the cuda_ipc tests that need a GPU: the device check they skip on, device
// buffers, and a peer process on the same GPU.
//
// The peer is this test binary run again (/proc/self/exe) with only CudaIpcPeer.Serve
// selected and KVFERRY_CUDA_IPC_PEER=1: it registers `bytes` of device memory on cuda:0,
// prints "peer {endpoint} {addr} {host addr or 0}" and answers "verify SEED OFFSET LEN" (-> "reply
// ok" or "reply mismatch AT") and "fill SEED OFFSET LEN" (-> "reply ok") until its input closes.
// Lines that do not start with "peer " or "reply " (gtest's own output) are skipped.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>

#include "core/child_process.h"
#include "core/pattern.h"
#include "test_support.h"

namespace kvferry::cuda_ipc::testing {

inline constexpr const char* kPeerEnv = "KVFERRY_CUDA_IPC_PEER";
inline constexpr const char* kPeerHostEnv = "KVFERRY_CUDA_IPC_PEER_HOST";

// Empty when a CUDA device is usable, else why not (the skip reason).
inline std::string no_device_reason() {
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorString(e);
  }
  return devices == 0 ? "no CUDA device: cudaGetDeviceCount found none" : "";
}

#define KVF_SKIP_WITHOUT_GPU()                                                              \
  do {                                                                                      \
    if (std::string why = ::kvferry::cuda_ipc::testing::no_device_reason(); !why.empty()) { \
      GTEST_SKIP() << "GPU test not run: " << why;                                          \
    }                                                                                       \
  } while (false)

// cudaMalloc'd (or cudaMallocHost'd) memory, freed on destruction.
class CudaBuffer {
 public:
  static CudaBuffer device(size_t bytes) {
    CudaBuffer b;
    b.bytes_ = bytes;
    EXPECT_EQ(cudaMalloc(&b.ptr_, bytes), cudaSuccess);
    return b;
  }
  static CudaBuffer pinned_host(size_t bytes) {
    CudaBuffer b;
    b.bytes_ = bytes;
    b.pinned_ = true;
    EXPECT_EQ(cudaMallocHost(&b.ptr_, bytes), cudaSuccess);
    return b;
  }
  CudaBuffer(CudaBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_), pinned_(o.pinned_) {
    o.ptr_ = nullptr;
  }
  CudaBuffer& operator=(CudaBuffer&&) = delete;
  ~CudaBuffer() {
    if (ptr_ == nullptr) return;
    if (pinned_) {
      cudaFreeHost(ptr_);
    } else {
      cudaFree(ptr_);
    }
  }
  void* get() const { return ptr_; }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(ptr_); }
  size_t bytes() const { return bytes_; }

  // Writes the test pattern (seed, at offsets [offset, +len) of the pattern stream).
  void fill(uint64_t seed, uint64_t offset, uint64_t len) const {
    std::vector<std::byte> host(len);
    fill_pattern(host, seed, offset);
    ASSERT_EQ(cudaMemcpy(static_cast<char*>(ptr_) + offset, host.data(), len, cudaMemcpyDefault),
              cudaSuccess);
  }
  // The first mismatching byte against the pattern, or -1.
  int64_t mismatch(uint64_t seed, uint64_t offset, uint64_t len) const {
    std::vector<std::byte> host(len);
    if (cudaMemcpy(host.data(), static_cast<char*>(ptr_) + offset, len, cudaMemcpyDefault) !=
        cudaSuccess) {
      return 0;
    }
    auto at = find_pattern_mismatch(host, seed, offset);
    return at ? static_cast<int64_t>(*at) : -1;
  }

 private:
  CudaBuffer() = default;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  bool pinned_ = false;
};

struct GpuPeer {
  ChildProcess process;
  std::string endpoint;
  uint64_t addr = 0;
  uint64_t host_addr = 0;  // the peer's host buffer (start_gpu_peer with_host), else 0

  // The next line starting with `prefix`, without it.
  Result<std::string> read(const std::string& prefix) {
    for (;;) {
      KVF_ASSIGN_OR_RETURN(std::string line, process.read_line(std::chrono::seconds(60)));
      if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
    }
  }
  std::string ask(const std::string& command) {
    if (Status s = process.send_line(command); !s.ok()) return s.to_string();
    Result<std::string> reply = read("reply ");
    return reply.ok() ? *reply : reply.status().to_string();
  }
};

inline Result<GpuPeer> start_gpu_peer(uint64_t bytes, bool with_host = false) {
  ::setenv(kPeerEnv, std::to_string(bytes).c_str(), 1);
  if (with_host) ::setenv(kPeerHostEnv, "1", 1);
  Result<ChildProcess> child = ChildProcess::spawn(
      {"/proc/self/exe", "--gtest_filter=CudaIpcPeer.Serve", "--gtest_brief=1"});
  ::unsetenv(kPeerEnv);
  ::unsetenv(kPeerHostEnv);
  KVF_RETURN_IF_ERROR(child.status());
  GpuPeer peer{std::move(*child), "", 0, 0};
  KVF_ASSIGN_OR_RETURN(std::string hello, peer.read("peer "));
  std::istringstream in(hello);
  in >> peer.endpoint >> peer.addr >> peer.host_addr;
  if (peer.endpoint.empty() || peer.addr == 0) return Internal("bad peer greeting: " + hello);
  return peer;
}

}  // namespace kvferry::cuda_ipc::testing
