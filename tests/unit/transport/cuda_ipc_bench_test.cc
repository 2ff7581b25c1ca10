// The seed's comparison on cuda_ipc, between two processes on one GPU: one request's KV of
// deepseek-v3 (MLA, 61 layers, 1152 bytes per token, page size 64) sent with all_layers
// and with per_layer, against a single device-to-device copy of the same total bytes, in
// the same run, taking turns round by round. Runs only with KVFERRY_CUDA_BENCH=1 (and a
// GPU; scripts/gpu-check.sh sets it); appends its results to $KVFERRY_CUDA_BENCH_OUT.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <numeric>
#include <random>

#include "kvferry/kv/plan_executor.h"
#include "kvferry/kv/planner.h"
#include "unit/transport/cuda_ipc_gpu_support.h"

namespace kvferry::cuda_ipc::testing {
namespace {

using kvferry::testing::make_engine;
using kvferry::testing::must;
using Seconds = std::chrono::duration<double>;

constexpr kv::MlaShape kShapeWithoutPool{61, 64, 1152, 0};
constexpr int kRounds = 20;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void bench(uint32_t tokens, std::ofstream& out) {
  const uint32_t pages = tokens / kShapeWithoutPool.page_size_tokens;
  kv::MlaShape shape = kShapeWithoutPool;
  shape.num_pages = 2 * pages;  // room for random placement
  const uint64_t pool_bytes = must(kv::KvLayout::region_bytes(shape));
  GpuPeer peer = must(start_gpu_peer(pool_bytes));
  auto engine = make_engine("bench");
  PeerHandle handle = must(engine->open_peer(peer.endpoint));
  ASSERT_EQ(handle.transport(), TransportKind::kCudaIpc);
  CudaBuffer pool = CudaBuffer::device(pool_bytes);
  ASSERT_TRUE(
      engine->register_memory(pool.get(), pool_bytes, {MemoryLocation::Kind::kCuda, 0}).ok());
  kv::KvLayout src = must(kv::KvLayout::mla(shape, pool.addr()));
  kv::KvLayout dst = must(kv::KvLayout::mla(shape, peer.addr));
  std::mt19937 rng(tokens);
  std::vector<kv::PageIndex> all(shape.num_pages);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<kv::PageIndex> src_pages(all.begin(), all.begin() + pages);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<kv::PageIndex> dst_pages(all.begin(), all.begin() + pages);
  kv::TransferPlan all_layers = must(kv::build_transfer_plan(src, dst, src_pages, dst_pages, {}));
  kv::PlanOptions per_layer_options;
  per_layer_options.strategy = kv::SendStrategy::kPerLayer;
  kv::TransferPlan per_layer =
      must(kv::build_transfer_plan(src, dst, src_pages, dst_pages, per_layer_options));
  const uint64_t bytes = uint64_t{pages} * 64 * 1152 * 61;
  CudaBuffer ref_src = CudaBuffer::device(bytes), ref_dst = CudaBuffer::device(bytes);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<double> t_all, t_per, t_ref;
  for (int round = -3; round < kRounds; ++round) {  // three warm-up rounds
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(kv::execute(all_layers, *engine, handle).ok());
    auto t1 = std::chrono::steady_clock::now();
    ASSERT_TRUE(kv::execute(per_layer, *engine, handle).ok());
    auto t2 = std::chrono::steady_clock::now();
    ASSERT_EQ(cudaMemcpyAsync(ref_dst.get(), ref_src.get(), bytes, cudaMemcpyDefault, stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    auto t3 = std::chrono::steady_clock::now();
    if (round < 0) continue;
    t_all.push_back(Seconds(t1 - t0).count());
    t_per.push_back(Seconds(t2 - t1).count());
    t_ref.push_back(Seconds(t3 - t2).count());
  }
  cudaStreamDestroy(stream);
  const double all_s = median(t_all), per_s = median(t_per), ref_s = median(t_ref);
  std::string line = fmt::format(
      "deepseek-v3 tokens={} pages={} bytes={} blocks={} | all_layers {:.3f} ms ({:.1f} GB/s) | "
      "per_layer {:.3f} ms | single d2d copy {:.3f} ms ({:.1f} GB/s) | all/per {:.2f} (goal <= "
      "0.67) | all bw / copy bw {:.2f} (goal >= 0.8)",
      tokens, pages, bytes, all_layers.num_blocks(), all_s * 1e3, bytes / all_s / 1e9, per_s * 1e3,
      ref_s * 1e3, bytes / ref_s / 1e9, all_s / per_s, ref_s / all_s);
  std::cout << line << std::endl;
  out << line << "\n";
  EXPECT_LE(all_s / per_s, 0.67) << line;
  EXPECT_GE(ref_s / all_s, 0.8) << line;
}

TEST(CudaIpcBench, DeepseekV3AllLayersVsPerLayerVsOneDeviceCopy) {
  const char* enabled = std::getenv("KVFERRY_CUDA_BENCH");
  if (enabled == nullptr || std::string(enabled) != "1") {
    GTEST_SKIP() << "benchmark: runs only with KVFERRY_CUDA_BENCH=1 (scripts/gpu-check.sh)";
  }
  KVF_SKIP_WITHOUT_GPU();
  const char* path = std::getenv("KVFERRY_CUDA_BENCH_OUT");
  std::ofstream out(path != nullptr ? path : "/dev/null", std::ios::app);
  int device = 0;
  cudaDeviceProp props{};
  cudaGetDevice(&device);
  cudaGetDeviceProperties(&props, device);
  out << "gpu: " << props.name << "\n";
  for (uint32_t tokens : {4096u, 16384u}) bench(tokens, out);
}

}  // namespace
}  // namespace kvferry::cuda_ipc::testing
