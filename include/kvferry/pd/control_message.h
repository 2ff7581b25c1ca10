// Control messages between a decode rank and a prefill rank: versioned, length-checked
// binary frames (docs/PROTOCOL.md, "PD session layer").
//
// Frame = 12-byte header (magic "KVFP", version, type, payload length; little-endian) and a
// payload of fixed-width little-endian fields, counts before lists, strings as u32 length +
// bytes. decode_control_message() is a pure function over bytes: every count and length is
// checked against what is left before anything is allocated, every enum against its range,
// and trailing bytes are an error. It never crashes on arbitrary input (fuzzed by
// fuzz/control_message_fuzz.cc). Semantic checks (a layout's entries are sane) belong to the
// receiver of the message (KvLayout::create).
//
// Thread-safety: pure functions and plain values.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "kvferry/kv/kv_layout.h"
#include "kvferry/kv/slot_plan.h"
#include "kvferry/pd/request_state.h"
#include "kvferry/status.h"

namespace kvferry::pd {

inline constexpr uint32_t kControlMagic = 0x5046564B;  // "KVFP" as little-endian bytes
inline constexpr uint16_t kControlVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 12;
inline constexpr uint32_t kMaxControlPayloadBytes = 16u << 20;
inline constexpr uint32_t kMaxReasonBytes = 4096;
inline constexpr uint32_t kMaxEndpointBytes = 256;
// Sentinel for "no aux row" / "no state slot".
inline constexpr uint64_t kNoSlot = ~uint64_t{0};
// Bound on the ranges of one page's integrity footprint (head slicing: one per token per
// entry of the page).
inline constexpr uint32_t kMaxFootprintRanges = 1u << 16;

enum class MessageType : uint16_t {
  kRegisterLayout = 1,  // decode -> prefill, once per connection
  kRegisterReply,       // prefill -> decode
  kTransferRequest,     // decode -> prefill, once per request
  kRequestStatus,       // prefill -> decode
  kAbort,               // either way
  kAbortAck,            // prefill -> decode, after the request's in-flight writes drained
  kHeartbeat,           // either way, every heartbeat interval
  kAuthChallenge,       // prefill -> decode, the first frame of every connection
  kAuthProof,           // decode -> prefill, the answer to a non-empty challenge
};
inline constexpr uint16_t kMaxMessageType = static_cast<uint16_t>(MessageType::kAuthProof);
// Nonce and proof sizes of the control channel's authentication (core/auth.h).
inline constexpr uint32_t kMaxAuthBytes = 64;

// Decode's KV, aux and state buffers, as it registers them with one prefill rank.
struct RegisterLayout {
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  uint32_t total_kv_heads = 0;  // heads of the whole model (for head slicing); 0 = unknown
  std::string engine_endpoint;  // the decode engine's peer name "host:port"
  uint64_t incarnation = 0;     // the decode engine's incarnation
  kv::KvLayoutInfo info;
  std::vector<kv::KvEntry> entries;
  std::vector<kv::RowBuffer> aux;
  std::vector<kv::MambaStateTensor> state;
};

struct RegisterReply {
  uint32_t prefill_tp_rank = 0;
  uint64_t incarnation = 0;  // the prefill engine's incarnation
  StatusCode code = StatusCode::kOk;
  std::string reason;  // why the layout was refused when code != kOk
};

// Where one request's KV goes on one decode rank.
struct TransferRequest {
  uint64_t room = 0;                // the request id both sides were given
  uint32_t required_dst_ranks = 1;  // decode ranks that send a request for this room here
  bool dummy = false;               // replicated MLA: this prefill rank sends no data
  std::vector<kv::PageIndex> dst_pages;
  uint64_t aux_row = kNoSlot;
  uint64_t state_slot = kNoSlot;
};

// One byte range of a destination page: `bytes` at `offset` into page p of entry `entry`
// (address entries[entry].base + p * page_stride + offset) of decode's layout.
struct PageRange {
  uint32_t entry = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  bool operator==(const PageRange&) const = default;
};

struct PageDigest {
  kv::PageIndex page = 0;  // decode's page index
  uint64_t xxh3 = 0;       // XXH3-64 of the footprint's bytes of that page, in footprint order
  bool operator==(const PageDigest&) const = default;
};

// Opt-in end-to-end integrity (PdIntegrity): what one prefill rank wrote to each destination
// page of a request. Every page of a request gets the same footprint from one prefill rank
// (the planners slice every page alike), so it travels once; decode hashes the footprint's
// ranges of each page in place and compares.
struct PageIntegrity {
  std::vector<PageRange> footprint;  // sorted by (entry, offset), non-overlapping
  std::vector<PageDigest> digests;   // one per destination page of the request
  bool operator==(const PageIntegrity&) const = default;
};

struct RequestStatusMessage {
  uint64_t room = 0;
  RequestState state = RequestState::kSuccess;
  StatusCode code = StatusCode::kOk;
  std::string reason;
  // Optional trailing field (absent = no integrity data): only on Success, only when the
  // prefill rank runs with integrity enabled.
  std::optional<PageIntegrity> integrity;
};

struct AbortMessage {
  uint64_t room = 0;
  std::string reason;
};

struct AbortAck {
  uint64_t room = 0;
};

struct Heartbeat {
  uint64_t sequence = 0;
  uint64_t incarnation = 0;
};

// Authentication (a prefill with a secret): the challenge carries a 32-byte nonce, and
// nothing but a matching proof (HMAC-SHA256(secret, nonce)) is accepted before it. An empty
// nonce means authentication is off on that prefill. The challenge is also the rank's
// greeting: it says which incarnation listens on the port, which is how the bootstrap server
// checks a registration that claims a restart against the rank itself.
struct AuthChallengeMessage {
  std::string nonce;         // raw bytes; empty = no authentication
  uint64_t incarnation = 0;  // the prefill engine's incarnation
};
struct AuthProofMessage {
  std::string proof;  // raw bytes
};

using ControlMessage =
    std::variant<RegisterLayout, RegisterReply, TransferRequest, RequestStatusMessage, AbortMessage,
                 AbortAck, Heartbeat, AuthChallengeMessage, AuthProofMessage>;

MessageType message_type(const ControlMessage& message);
std::string_view message_type_name(MessageType type);

struct FrameHeader {
  MessageType type = MessageType::kHeartbeat;
  uint32_t payload_bytes = 0;
};

// The whole frame (header + payload).
std::vector<std::byte> encode_control_message(const ControlMessage& message);

// Checks magic, version, type and the payload limit. ProtocolError naming the bad field.
Result<FrameHeader> decode_frame_header(std::span<const std::byte> header);
// Decodes a payload of the given type. ProtocolError naming what did not parse.
Result<ControlMessage> decode_control_payload(MessageType type, std::span<const std::byte> payload);
// Decodes one whole frame; its length must match the header exactly.
Result<ControlMessage> decode_control_message(std::span<const std::byte> frame);

}  // namespace kvferry::pd
