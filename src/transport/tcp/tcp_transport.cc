#include "transport/tcp/tcp_transport.h"

#include <fmt/format.h>

#include "transport/tcp/tcp_link.h"
#include "transport/tcp/tcp_server.h"

namespace kvferry {
namespace {

class TcpTransport final : public Transport {
 public:
  TcpTransport(const TransportEnv& env, std::unique_ptr<TcpServer> server)
      : env_(env), server_(std::move(server)), endpoint_(server_->endpoint().to_string()) {}

  TransportKind kind() const override { return TransportKind::kTcp; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.access = CopyAccess::kRemoteAddress;
    caps.target_runs_progress = true;
    return caps;
  }
  void describe(SegmentDescriptor& self) const override { self.tcp_endpoint = endpoint_; }
  std::string why_not(RouteKey key, PeerPlace, const SegmentDescriptor& peer) const override {
    if (key.local == MemoryKind::kDevice || key.remote == MemoryKind::kDevice) {
      return "tcp moves host memory only";
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
    return std::shared_ptr<TransportLink>(std::make_shared<detail::TcpLink>(std::move(link)));
  }

 private:
  TransportEnv env_;
  std::unique_ptr<TcpServer> server_;
  std::string endpoint_;
};

}  // namespace

Result<std::unique_ptr<Transport>> make_tcp_transport(const TransportEnv& env) {
  if (env.tcp_lanes < 1 || env.tcp_lanes > 64) {
    return InvalidArgument(fmt::format("tcp_lanes {} out of range 1..64", env.tcp_lanes));
  }
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
  KVF_ASSIGN_OR_RETURN(auto server, TcpServer::start(tcp, env.local_regions));
  return std::unique_ptr<Transport>(new TcpTransport(env, std::move(server)));
}

}  // namespace kvferry
