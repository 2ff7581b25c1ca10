#include "transport/tcp/tcp_transport.h"

#include <fmt/format.h>

#include "transport/tcp/tcp_lane_service.h"
#include "transport/tcp/tcp_link.h"
#include "transport/tcp/tcp_server.h"
#include "transport/tcp/tcp_staging_pool.h"

namespace kvferry {
namespace {

class TcpTransport final : public Transport {
 public:
  TcpTransport(const TransportEnv& env, std::unique_ptr<TcpServer> server,
               std::shared_ptr<TcpDeviceStaging> device,
               std::shared_ptr<detail::TcpLaneService> lanes)
      : env_(env),
        server_(std::move(server)),
        device_(std::move(device)),
        lanes_(std::move(lanes)),
        endpoint_(server_->endpoint().to_string()) {}

  TransportKind kind() const override { return TransportKind::kTcp; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    // With a CUDA build, device memory on either side is staged through pinned buffers.
    caps.access = device_->built() ? CopyAccess::kStagedRemoteAddress : CopyAccess::kRemoteAddress;
    caps.reaches_local_device = device_->built();
    caps.target_runs_progress = true;
    return caps;
  }
  void describe(SegmentDescriptor& self) const override { self.tcp_endpoint = endpoint_; }
  // A device region is one tcp can stage: device memory of the device it was registered as.
  Status prepare_region(RegionEntry& entry) override {
    KVF_ASSIGN_OR_RETURN(std::shared_ptr<CudaMemoryApi> api, device_->api());
    KVF_ASSIGN_OR_RETURN(PointerInfo info, api->pointer_info(entry.host_ptr));
    if (info.kind != PointerKind::kDevice || info.device != entry.location.device) {
      return InvalidArgument(fmt::format("{:#x} is {} (device {}), not memory of cuda:{}",
                                         entry.addr, pointer_kind_name(info.kind), info.device,
                                         entry.location.device));
    }
    return Status::Ok();
  }
  std::string why_not(RouteKey key, PeerPlace, const SegmentDescriptor& peer) const override {
    if (key.local == MemoryKind::kDevice || key.remote == MemoryKind::kDevice) {
      if (!device_->built()) return "this build has no CUDA: tcp cannot stage device memory";
      if (key.local == MemoryKind::kDevice) {
        if (auto api = device_->api(); !api.ok()) {
          return "tcp cannot stage device memory here: " + api.status().message();
        }
      }
    }
    if (peer.tcp_endpoint.empty()) return "the peer advertises no tcp endpoint";
    return "";
  }
  Result<std::shared_ptr<TransportLink>> connect(const PeerInfo& peer) override {
    detail::TcpLinkOptions link;
    KVF_ASSIGN_OR_RETURN(link.endpoint, parse_endpoint(peer.descriptor.tcp_endpoint));
    link.peer_name = peer.name;
    link.expected_incarnation = peer.descriptor.incarnation;
    link.lanes = env_.tcp_lanes;
    link.connect_timeout = env_.connect_timeout;
    link.secret = env_.secret;
    link.frame_rest_timeout = env_.frame_rest_timeout;
    link.device = device_;
    link.service = lanes_;
    return std::shared_ptr<TransportLink>(std::make_shared<detail::TcpLink>(std::move(link)));
  }

 private:
  TransportEnv env_;
  std::unique_ptr<TcpServer> server_;
  std::shared_ptr<TcpDeviceStaging> device_;
  std::shared_ptr<detail::TcpLaneService> lanes_;  // shared with the links' lanes
  std::string endpoint_;
};

}  // namespace

Result<std::unique_ptr<Transport>> make_tcp_transport(const TransportEnv& env) {
  if (env.tcp_lanes < 1 || env.tcp_lanes > 64) {
    return InvalidArgument(fmt::format("tcp_lanes {} out of range 1..64", env.tcp_lanes));
  }
  const uint64_t staging_bytes =
      env.tcp_staging_buffer_bytes == 0 ? kDefaultStagingBufferBytes : env.tcp_staging_buffer_bytes;
  const int staging_buffers =
      env.tcp_staging_buffers == 0 ? kDefaultStagingBuffers : env.tcp_staging_buffers;
  if (staging_bytes < kMinStagingBufferBytes || staging_bytes > kMaxStagingBufferBytes) {
    return InvalidArgument(fmt::format("tcp_staging_buffer_bytes {} out of range {}..{}",
                                       staging_bytes, kMinStagingBufferBytes,
                                       kMaxStagingBufferBytes));
  }
  if (staging_buffers < 1 || staging_buffers > kMaxStagingBuffers) {
    return InvalidArgument(fmt::format("tcp_staging_buffers {} out of range 1..{}", staging_buffers,
                                       kMaxStagingBuffers));
  }
  auto device =
      std::make_shared<TcpDeviceStaging>(env.open_cuda_api, staging_bytes, staging_buffers);
  TcpServerOptions tcp;
  if (env.tcp_listen_address.empty()) {
    tcp.listen = Endpoint{env.listen_host, 0};
  } else {
    KVF_ASSIGN_OR_RETURN(tcp.listen, parse_endpoint(env.tcp_listen_address, true));
  }
  tcp.io_threads = env.tcp_io_threads;
  tcp.incarnation = env.incarnation;
  tcp.secret = env.secret;
  tcp.limits = env.tcp_limits;
  tcp.max_queued_replies = env.tcp_max_queued_replies;
  tcp.stall_timeout = env.tcp_stall_timeout;
  tcp.frame_rest_timeout = env.frame_rest_timeout;
  tcp.device = device;
  KVF_ASSIGN_OR_RETURN(auto server, TcpServer::start(tcp, env.local_regions));
  KVF_ASSIGN_OR_RETURN(auto lanes, detail::TcpLaneService::create());
  return std::unique_ptr<Transport>(
      new TcpTransport(env, std::move(server), std::move(device), std::move(lanes)));
}

}  // namespace kvferry
