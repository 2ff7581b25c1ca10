// RawControlClient: the PD control protocol spoken by hand, for the hostile-client tests.
#pragma once

#include <chrono>
#include <string>
#include <variant>
#include <vector>

#include "core/frame_header.h"
#include "core/net.h"
#include "unit/pd/pd_fixture.h"

namespace kvferry::pd {

// A raw TCP client speaking control frames to a prefill's control listener, as an attacker
// would: no kvferry decode client, just the wire protocol.
class RawControlClient {
 public:
  explicit RawControlClient(const std::string& endpoint)
      : fd_(testing::must(connect_tcp(testing::must(parse_endpoint(endpoint)), deadline()))) {}
  Status send(const ControlMessage& m) {
    return send_all(fd_.get(), encode_control_message(m), deadline());
  }
  Result<ControlMessage> read() {
    std::byte header[kFrameHeaderBytes];
    KVF_RETURN_IF_ERROR(recv_all(fd_.get(), header, deadline()));
    KVF_ASSIGN_OR_RETURN(FrameHeader h, decode_frame_header(header));
    std::vector<std::byte> payload(h.payload_bytes);
    KVF_RETURN_IF_ERROR(recv_all(fd_.get(), payload, deadline()));
    return decode_control_payload(h.type, payload);
  }
  // The next frame that is not a Heartbeat.
  Result<ControlMessage> read_skipping_heartbeats() {
    for (int i = 0; i < 100; ++i) {
      KVF_ASSIGN_OR_RETURN(ControlMessage m, read());
      if (!std::holds_alternative<Heartbeat>(m)) return m;
    }
    return Internal("only heartbeats");
  }
  // Reads the challenge (no secret) and registers `rank`'s layout and engine, as a decode
  // rank does; the RegisterReply's status.
  Status register_as(const testing::TestRank& rank) {
    KVF_RETURN_IF_ERROR(read().status());  // the AuthChallenge
    RegisterLayout reg;
    reg.tp_rank = rank.tp.rank;
    reg.tp_size = rank.tp.size;
    reg.total_kv_heads = rank.tp.total_kv_heads;
    reg.engine_endpoint = rank.engine->endpoint();
    reg.incarnation = rank.engine->incarnation();
    reg.info = rank.buffers.layout.info();
    reg.entries.assign(rank.buffers.layout.entries().begin(), rank.buffers.layout.entries().end());
    reg.aux = rank.buffers.aux;
    reg.state = rank.buffers.state;
    KVF_RETURN_IF_ERROR(send(reg));
    KVF_ASSIGN_OR_RETURN(ControlMessage m, read_skipping_heartbeats());
    const auto* reply = std::get_if<RegisterReply>(&m);
    if (reply == nullptr) return ProtocolError("no RegisterReply");
    return Status(reply->code, reply->reason);
  }
  // Returns once prefill handled everything sent before: it handles a connection's frames in
  // order, and answers an Abort of a room nobody has with an AbortAck.
  Status barrier() {
    constexpr uint64_t kNoSuchRoom = ~uint64_t{0};
    KVF_RETURN_IF_ERROR(send(AbortMessage{kNoSuchRoom, "barrier"}));
    for (int i = 0; i < 100; ++i) {
      KVF_ASSIGN_OR_RETURN(ControlMessage m, read_skipping_heartbeats());
      if (const auto* ack = std::get_if<AbortAck>(&m); ack != nullptr && ack->room == kNoSuchRoom) {
        return Status::Ok();
      }
    }
    return Internal("no AbortAck for the barrier");
  }
  // The next RequestStatus.
  Result<RequestStatusMessage> read_status() {
    for (int i = 0; i < 100; ++i) {
      KVF_ASSIGN_OR_RETURN(ControlMessage m, read_skipping_heartbeats());
      if (auto* status = std::get_if<RequestStatusMessage>(&m)) return std::move(*status);
    }
    return Internal("no RequestStatus");
  }

 private:
  static Clock::time_point deadline() { return Clock::now() + std::chrono::seconds(10); }
  Fd fd_;
};

}  // namespace kvferry::pd
