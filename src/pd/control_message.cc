#include "kvferry/pd/control_message.h"

#include <string>

#include "core/byte_codec.h"
#include "core/frame_header.h"

namespace kvferry::pd {
namespace {

static_assert(kFrameHeaderBytes == ::kvferry::kFrameHeaderBytes);
constexpr FrameFormat kControlFormat{"control", kControlMagic, kControlVersion, kMaxMessageType};

constexpr uint8_t kMaxRole = static_cast<uint8_t>(kv::KvRole::kOpaque);
constexpr uint8_t kMaxPageOrder = static_cast<uint8_t>(kv::PageOrder::kPageMajor);
constexpr size_t kEntryWireBytes = 8 * 4 + 4 + 1 + 1;
constexpr size_t kRowBufferWireBytes = sizeof(uint64_t) * 3;
constexpr size_t kPageRangeWireBytes = 4 + 8 + 8;
constexpr size_t kPageDigestWireBytes = sizeof(kv::PageIndex) + 8;

void put_rows(ByteWriter& w, const kv::RowBuffer& r) {
  w.put(r.base);
  w.put(r.bytes);
  w.put(r.row_bytes);
}
bool get_rows(ByteReader& r, kv::RowBuffer& out) {
  return r.get(out.base) && r.get(out.bytes) && r.get(out.row_bytes);
}

void encode(ByteWriter& w, const RegisterLayout& m) {
  w.put(m.tp_rank);
  w.put(m.tp_size);
  w.put(m.total_kv_heads);
  w.put_string(m.engine_endpoint);
  w.put(m.incarnation);
  w.put(m.info.page_size_tokens);
  w.put(m.info.kv_heads);
  w.put(m.info.head_dim);
  w.put(m.info.dtype_bytes);
  w.put(static_cast<uint8_t>(m.info.page_order));
  w.put(static_cast<uint32_t>(m.entries.size()));
  for (const kv::KvEntry& e : m.entries) {
    w.put(e.base);
    w.put(e.bytes);
    w.put(e.item_len);
    w.put(e.page_stride);
    w.put(e.layer_id);
    w.put(static_cast<uint8_t>(e.role));
    w.put(static_cast<uint8_t>(e.draft ? 1 : 0));
  }
  w.put(static_cast<uint32_t>(m.aux.size()));
  for (const kv::RowBuffer& a : m.aux) put_rows(w, a);
  w.put(static_cast<uint32_t>(m.state.size()));
  for (const kv::MambaStateTensor& s : m.state) {
    put_rows(w, s.rows);
    w.put(s.tp_dim);
  }
}

void encode(ByteWriter& w, const RegisterReply& m) {
  w.put(m.prefill_tp_rank);
  w.put(m.incarnation);
  w.put(static_cast<uint8_t>(m.code));
  w.put_string(m.reason);
}

void encode(ByteWriter& w, const TransferRequest& m) {
  w.put(m.room);
  w.put(m.required_dst_ranks);
  w.put(static_cast<uint8_t>(m.dummy ? 1 : 0));
  w.put(m.aux_row);
  w.put(m.state_slot);
  w.put(static_cast<uint32_t>(m.dst_pages.size()));
  for (kv::PageIndex p : m.dst_pages) w.put(p);
}

void encode(ByteWriter& w, const RequestStatusMessage& m) {
  w.put(m.room);
  w.put(static_cast<uint8_t>(m.state));
  w.put(static_cast<uint8_t>(m.code));
  w.put_string(m.reason);
  if (!m.integrity) return;
  w.put(static_cast<uint32_t>(m.integrity->footprint.size()));
  for (const PageRange& range : m.integrity->footprint) {
    w.put(range.entry);
    w.put(range.offset);
    w.put(range.bytes);
  }
  w.put(static_cast<uint32_t>(m.integrity->digests.size()));
  for (const PageDigest& d : m.integrity->digests) {
    w.put(d.page);
    w.put(d.xxh3);
  }
}

void encode(ByteWriter& w, const AbortMessage& m) {
  w.put(m.room);
  w.put_string(m.reason);
}
void encode(ByteWriter& w, const AbortAck& m) { w.put(m.room); }
void encode(ByteWriter& w, const Heartbeat& m) {
  w.put(m.sequence);
  w.put(m.incarnation);
}
void encode(ByteWriter& w, const AuthChallengeMessage& m) {
  w.put_string(m.nonce);
  w.put(m.incarnation);
}
void encode(ByteWriter& w, const AuthProofMessage& m) { w.put_string(m.proof); }

Status malformed(MessageType type, std::string_view what) {
  return ProtocolError("malformed " + std::string(message_type_name(type)) +
                       " message: " + std::string(what));
}

Result<ControlMessage> decode_register_layout(ByteReader& r) {
  RegisterLayout m;
  uint8_t order = 0;
  if (!(r.get(m.tp_rank) && r.get(m.tp_size) && r.get(m.total_kv_heads) &&
        r.get_string(m.engine_endpoint, kMaxEndpointBytes) && r.get(m.incarnation) &&
        r.get(m.info.page_size_tokens) && r.get(m.info.kv_heads) && r.get(m.info.head_dim) &&
        r.get(m.info.dtype_bytes) && r.get(order))) {
    return malformed(MessageType::kRegisterLayout, "truncated header fields");
  }
  if (order > kMaxPageOrder) {
    return malformed(MessageType::kRegisterLayout, "page order " + std::to_string(order));
  }
  if (m.tp_size == 0 || m.tp_rank >= m.tp_size) {
    return malformed(MessageType::kRegisterLayout, "tp rank " + std::to_string(m.tp_rank) +
                                                       " of size " + std::to_string(m.tp_size));
  }
  m.info.page_order = static_cast<kv::PageOrder>(order);
  uint32_t n = 0;
  if (!r.get_count(n, kEntryWireBytes)) {
    return malformed(MessageType::kRegisterLayout, "entry count exceeds the payload");
  }
  m.entries.resize(n);
  for (kv::KvEntry& e : m.entries) {
    uint8_t role = 0;
    uint8_t draft = 0;
    if (!(r.get(e.base) && r.get(e.bytes) && r.get(e.item_len) && r.get(e.page_stride) &&
          r.get(e.layer_id) && r.get(role) && r.get(draft))) {
      return malformed(MessageType::kRegisterLayout, "truncated entry");
    }
    if (role > kMaxRole || draft > 1) {
      return malformed(MessageType::kRegisterLayout, "entry role " + std::to_string(role) +
                                                         " or draft flag " + std::to_string(draft));
    }
    e.role = static_cast<kv::KvRole>(role);
    e.draft = draft == 1;
  }
  if (!r.get_count(n, kRowBufferWireBytes)) {
    return malformed(MessageType::kRegisterLayout, "aux count exceeds the payload");
  }
  m.aux.resize(n);
  for (kv::RowBuffer& a : m.aux) {
    if (!get_rows(r, a)) return malformed(MessageType::kRegisterLayout, "truncated aux buffer");
  }
  if (!r.get_count(n, kRowBufferWireBytes + 8)) {
    return malformed(MessageType::kRegisterLayout, "state count exceeds the payload");
  }
  m.state.resize(n);
  for (kv::MambaStateTensor& s : m.state) {
    if (!(get_rows(r, s.rows) && r.get(s.tp_dim))) {
      return malformed(MessageType::kRegisterLayout, "truncated state tensor");
    }
  }
  return ControlMessage(std::move(m));
}

// The optional trailing PageIntegrity of a RequestStatus.
Status decode_integrity(ByteReader& r, RequestStatusMessage& m) {
  constexpr MessageType type = MessageType::kRequestStatus;
  if (m.state != RequestState::kSuccess) {
    return malformed(
        type, "integrity data on a status in state " + std::string(request_state_name(m.state)));
  }
  PageIntegrity integrity;
  uint32_t n = 0;
  if (!r.get_count(n, kPageRangeWireBytes)) {
    return malformed(type, "footprint count exceeds the payload");
  }
  if (n == 0 || n > kMaxFootprintRanges) {
    return malformed(type, "footprint of " + std::to_string(n) + " ranges (1.." +
                               std::to_string(kMaxFootprintRanges) + ")");
  }
  integrity.footprint.resize(n);
  for (PageRange& range : integrity.footprint) {
    if (!(r.get(range.entry) && r.get(range.offset) && r.get(range.bytes))) {
      return malformed(type, "truncated footprint");
    }
    if (range.bytes == 0) return malformed(type, "empty footprint range");
  }
  if (!r.get_count(n, kPageDigestWireBytes)) {
    return malformed(type, "digest count exceeds the payload");
  }
  integrity.digests.resize(n);
  for (PageDigest& d : integrity.digests) {
    if (!(r.get(d.page) && r.get(d.xxh3))) return malformed(type, "truncated digest");
  }
  m.integrity = std::move(integrity);
  return Status::Ok();
}

bool valid_code(uint8_t code) { return is_valid_status_code(code); }

Result<ControlMessage> decode_payload(MessageType type, ByteReader& r) {
  switch (type) {
    case MessageType::kRegisterLayout: return decode_register_layout(r);
    case MessageType::kRegisterReply: {
      RegisterReply m;
      uint8_t code = 0;
      if (!(r.get(m.prefill_tp_rank) && r.get(m.incarnation) && r.get(code) &&
            r.get_string(m.reason, kMaxReasonBytes))) {
        return malformed(type, "truncated");
      }
      if (!valid_code(code)) return malformed(type, "status code " + std::to_string(code));
      m.code = static_cast<StatusCode>(code);
      return ControlMessage(std::move(m));
    }
    case MessageType::kTransferRequest: {
      TransferRequest m;
      uint8_t dummy = 0;
      uint32_t n = 0;
      if (!(r.get(m.room) && r.get(m.required_dst_ranks) && r.get(dummy) && r.get(m.aux_row) &&
            r.get(m.state_slot))) {
        return malformed(type, "truncated");
      }
      if (dummy > 1) return malformed(type, "dummy flag " + std::to_string(dummy));
      if (m.required_dst_ranks == 0) return malformed(type, "required_dst_ranks 0");
      if (!r.get_count(n, sizeof(kv::PageIndex))) {
        return malformed(type, "page count exceeds the payload");
      }
      m.dummy = dummy == 1;
      m.dst_pages.resize(n);
      for (kv::PageIndex& p : m.dst_pages) r.get(p);
      return ControlMessage(std::move(m));
    }
    case MessageType::kRequestStatus: {
      RequestStatusMessage m;
      uint8_t state = 0;
      uint8_t code = 0;
      if (!(r.get(m.room) && r.get(state) && r.get(code) &&
            r.get_string(m.reason, kMaxReasonBytes))) {
        return malformed(type, "truncated");
      }
      if (state > static_cast<uint8_t>(kMaxRequestState) || !valid_code(code)) {
        return malformed(type,
                         "state " + std::to_string(state) + " or code " + std::to_string(code));
      }
      m.state = static_cast<RequestState>(state);
      m.code = static_cast<StatusCode>(code);
      if (r.remaining() == 0) return ControlMessage(std::move(m));
      KVF_RETURN_IF_ERROR(decode_integrity(r, m));
      return ControlMessage(std::move(m));
    }
    case MessageType::kAbort: {
      AbortMessage m;
      if (!(r.get(m.room) && r.get_string(m.reason, kMaxReasonBytes))) {
        return malformed(type, "truncated");
      }
      return ControlMessage(std::move(m));
    }
    case MessageType::kAbortAck: {
      AbortAck m;
      if (!r.get(m.room)) return malformed(type, "truncated");
      return ControlMessage(m);
    }
    case MessageType::kHeartbeat: {
      Heartbeat m;
      if (!(r.get(m.sequence) && r.get(m.incarnation))) return malformed(type, "truncated");
      return ControlMessage(m);
    }
    case MessageType::kAuthChallenge: {
      AuthChallengeMessage m;
      if (!(r.get_string(m.nonce, kMaxAuthBytes) && r.get(m.incarnation))) {
        return malformed(type, "truncated or too long");
      }
      return ControlMessage(std::move(m));
    }
    case MessageType::kAuthProof: {
      AuthProofMessage m;
      if (!r.get_string(m.proof, kMaxAuthBytes)) return malformed(type, "truncated or too long");
      return ControlMessage(std::move(m));
    }
  }
  return ProtocolError("unknown message type " + std::to_string(static_cast<uint16_t>(type)));
}

}  // namespace

MessageType message_type(const ControlMessage& message) {
  return static_cast<MessageType>(message.index() + 1);
}

std::string_view message_type_name(MessageType type) {
  switch (type) {
    case MessageType::kRegisterLayout: return "RegisterLayout";
    case MessageType::kRegisterReply: return "RegisterReply";
    case MessageType::kTransferRequest: return "TransferRequest";
    case MessageType::kRequestStatus: return "RequestStatus";
    case MessageType::kAbort: return "Abort";
    case MessageType::kAbortAck: return "AbortAck";
    case MessageType::kHeartbeat: return "Heartbeat";
    case MessageType::kAuthChallenge: return "AuthChallenge";
    case MessageType::kAuthProof: return "AuthProof";
  }
  return "Unknown";
}

std::vector<std::byte> encode_control_message(const ControlMessage& message) {
  ByteWriter w;
  w.bytes().resize(kFrameHeaderBytes);  // written below, once the payload length is known
  std::visit([&](const auto& m) { encode(w, m); }, message);
  const auto payload = static_cast<uint32_t>(w.size() - kFrameHeaderBytes);
  encode_frame_header(
      make_frame_header(kControlFormat, static_cast<uint16_t>(message_type(message)), payload),
      std::span<std::byte, kFrameHeaderBytes>(w.bytes().data(), kFrameHeaderBytes));
  return std::move(w).take();
}

Result<FrameHeader> decode_frame_header(std::span<const std::byte> header) {
  KVF_ASSIGN_OR_RETURN(
      ::kvferry::FrameHeader h,
      ::kvferry::decode_frame_header(kControlFormat, header, kMaxControlPayloadBytes));
  return FrameHeader{static_cast<MessageType>(h.type), h.payload_bytes};
}

Result<ControlMessage> decode_control_payload(MessageType type,
                                              std::span<const std::byte> payload) {
  ByteReader r(payload);
  KVF_ASSIGN_OR_RETURN(ControlMessage message, decode_payload(type, r));
  if (!r.ok()) return malformed(type, "truncated");
  if (r.remaining() != 0) {
    return malformed(type, std::to_string(r.remaining()) + " trailing bytes");
  }
  return message;
}

Result<ControlMessage> decode_control_message(std::span<const std::byte> frame) {
  KVF_ASSIGN_OR_RETURN(FrameHeader header, decode_frame_header(frame));
  if (frame.size() - kFrameHeaderBytes != header.payload_bytes) {
    return ProtocolError("control frame of " + std::to_string(frame.size()) +
                         " bytes but header says payload " + std::to_string(header.payload_bytes));
  }
  return decode_control_payload(header.type, frame.subspan(kFrameHeaderBytes));
}

}  // namespace kvferry::pd
