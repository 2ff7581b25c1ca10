// RawNotifyClient: a hand-driven connection to a notification listener (the frames of
// src/engine/notify_wire.h), for tests that play a sender, well-behaved or not. Every call
// is bounded by kRawNotifyTimeout.
//
// Thread-safety: one object per thread; free functions from any.
#pragma once

#include <poll.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "core/auth.h"
#include "core/fd.h"
#include "core/net.h"
#include "engine/notify_wire.h"
#include "kvferry/status.h"

namespace kvferry::testing {

inline constexpr std::chrono::seconds kRawNotifyTimeout{5};

// Polls `done` every 5 ms until it holds or `limit` passed; returns its last value.
inline bool wait_for_state(const std::function<bool()>& done,
                           std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    if (done()) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

inline detail::NotifyHello notify_hello(const std::string& name, uint64_t incarnation,
                                        uint64_t target_incarnation = 0) {
  return detail::NotifyHello{target_incarnation, incarnation, name, "127.0.0.1:1"};
}

class RawNotifyClient {
 public:
  static Result<RawNotifyClient> connect(const Endpoint& to) {
    KVF_ASSIGN_OR_RETURN(Fd fd, connect_tcp(to, deadline()));
    return RawNotifyClient(std::move(fd));
  }
  explicit RawNotifyClient(Fd fd) : fd_(std::move(fd)) {}

  int fd() const { return fd_.get(); }
  void close() { fd_ = Fd(); }

  Status send(detail::NotifyFrame type, std::span<const std::byte> payload) {
    return detail::write_notify_frame(fd_.get(), type, payload, deadline());
  }
  Result<detail::NotifyMessage> read() {
    return detail::read_notify_frame(fd_.get(), detail::kMaxNotificationBytesLimit, deadline());
  }
  // Whether a frame (or the close) is waiting to be read now.
  bool readable_now() const {
    pollfd p{fd_.get(), POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }

  // Sends the hello and reads the challenge.
  Result<detail::NotifyChallenge> hello(const detail::NotifyHello& hello) {
    KVF_RETURN_IF_ERROR(send(detail::NotifyFrame::kHello, detail::encode_hello(hello)));
    KVF_ASSIGN_OR_RETURN(detail::NotifyMessage reply, read());
    if (reply.type != detail::NotifyFrame::kChallenge) return refusal(reply);
    return detail::decode_challenge(reply.payload);
  }
  // The hello, the proof of `secret` when the challenge asks for one, and the welcome.
  Status open(const detail::NotifyHello& hello_frame,
              const std::optional<std::string>& secret = std::nullopt) {
    KVF_ASSIGN_OR_RETURN(detail::NotifyChallenge challenge, hello(hello_frame));
    if (!challenge.nonce.empty()) {
      if (!secret) return Unauthenticated("the listener asks for a secret");
      AuthProof proof = auth_proof(*secret, std::as_bytes(std::span(challenge.nonce)));
      KVF_RETURN_IF_ERROR(send(detail::NotifyFrame::kProof, proof));
    }
    KVF_ASSIGN_OR_RETURN(detail::NotifyMessage welcome, read());
    if (welcome.type != detail::NotifyFrame::kWelcome) return refusal(welcome).status();
    return Status::Ok();
  }
  Status notify(uint64_t sequence, std::string_view bytes) {
    return send(detail::NotifyFrame::kNotify, detail::encode_notify(sequence, bytes));
  }
  Result<uint64_t> ack() {
    KVF_ASSIGN_OR_RETURN(detail::NotifyMessage reply, read());
    if (reply.type != detail::NotifyFrame::kAck) return refusal(reply).status();
    return detail::decode_sequence(reply.payload);
  }

 private:
  static Clock::time_point deadline() { return Clock::now() + kRawNotifyTimeout; }
  static Result<detail::NotifyChallenge> refusal(const detail::NotifyMessage& m) {
    return ProtocolError(
        "frame type " + std::to_string(static_cast<int>(m.type)) + ": " +
        std::string(reinterpret_cast<const char*>(m.payload.data()), m.payload.size()));
  }

  Fd fd_;
};

}  // namespace kvferry::testing
