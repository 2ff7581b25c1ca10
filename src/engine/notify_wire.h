// The engine notification channel's wire format (docs/PROTOCOL.md, "Notifications"): one
// long-lived TCP connection per (sender engine, target engine), framed with the 12-byte
// header of core/frame_header.h (magic "KVFN").
//
//   sender -> target   kHello     target incarnation u64, sender incarnation u64,
//                                 sender name (string), sender endpoint (string)
//   target -> sender   kChallenge target incarnation u64, max notification bytes u32,
//                                 nonce (string: empty when no secret is required)
//   sender -> target   kProof     HMAC-SHA256(secret, nonce), 32 bytes (only after a nonce)
//   target -> sender   kWelcome   empty                  | kError message, then close
//   sender -> target   kNotify    sequence u64, the notification's bytes
//   target -> sender   kAck       sequence u64: the notification is in the target's inbox
//   sender -> target   kBye       empty: a clean close (the target reports no lost sender)
//
// Every payload length is checked against the frame type's bound before anything is
// allocated for it; the hello (the only frame before the proof) is at most
// kMaxNotifyHelloBytes, the proof at most the HMAC's 32 bytes.
//
// Thread-safety: pure functions, and I/O on a connection the caller owns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/frame_header.h"
#include "core/net.h"
#include "kvferry/status.h"

namespace kvferry::detail {

inline constexpr uint32_t kNotifyMagic = 0x4E46564B;  // "KVFN" in memory order
inline constexpr uint16_t kNotifyVersion = 1;
enum class NotifyFrame : uint16_t {
  kHello = 1,
  kChallenge = 2,
  kProof = 3,
  kWelcome = 4,
  kNotify = 5,
  kAck = 6,
  kError = 7,
  kBye = 8,
};
inline constexpr FrameFormat kNotifyFormat{"notification", kNotifyMagic, kNotifyVersion,
                                           static_cast<uint16_t>(NotifyFrame::kBye)};
// Bound of every frame but kNotify, kHello and kProof (nonces, error messages).
inline constexpr uint32_t kMaxNotifyControlBytes = 4096;
// The hello's strings: an engine's name (EngineOptions::name), and its endpoint, host:port
// (a DNS name of at most 253 characters or a bracketed IPv6 literal, then the port).
inline constexpr uint32_t kMaxNotifySenderNameBytes = 256;
inline constexpr uint32_t kMaxNotifySenderEndpointBytes = 264;
// The largest legitimate hello, and so the most a connection that has proved nothing may
// make the target buffer: two incarnations and two length-prefixed strings.
inline constexpr uint32_t kMaxNotifyHelloBytes =
    8 + 8 + 4 + kMaxNotifySenderNameBytes + 4 + kMaxNotifySenderEndpointBytes;
// The largest notification an engine may be configured to accept.
inline constexpr uint32_t kMaxNotificationBytesLimit = 1u << 20;

struct NotifyHello {
  uint64_t target_incarnation = 0;
  uint64_t sender_incarnation = 0;
  std::string sender_name;
  std::string sender_endpoint;
};

struct NotifyChallenge {
  uint64_t target_incarnation = 0;
  uint32_t max_notification_bytes = 0;
  std::string nonce;  // empty: no proof required
};

std::vector<std::byte> encode_hello(const NotifyHello& hello);
Result<NotifyHello> decode_hello(std::span<const std::byte> payload);
std::vector<std::byte> encode_challenge(const NotifyChallenge& challenge);
Result<NotifyChallenge> decode_challenge(std::span<const std::byte> payload);
// kNotify: the sequence number then the bytes; kAck: the sequence number.
std::vector<std::byte> encode_notify(uint64_t sequence, std::string_view bytes);
std::vector<std::byte> encode_sequence(uint64_t sequence);
Result<uint64_t> decode_sequence(std::span<const std::byte> payload);

struct NotifyMessage {
  NotifyFrame type = NotifyFrame::kError;
  std::vector<std::byte> payload;
};

// Writes one frame (header and payload) before `deadline`.
Status write_notify_frame(int fd, NotifyFrame type, std::span<const std::byte> payload,
                          Clock::time_point deadline);
// Reads one frame whose payload is at most `max_payload` bytes (kNotify) or
// kMaxNotifyControlBytes (any other type) before `deadline`; a longer one is a
// ProtocolError naming its size, refused before it is read.
Result<NotifyMessage> read_notify_frame(int fd, uint32_t max_payload, Clock::time_point deadline);

// Waits until `fd` is readable (or closed), at most until `until`: true when it is.
bool wait_readable(int fd, Clock::time_point until);

}  // namespace kvferry::detail
