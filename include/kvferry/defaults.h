// Defaults shared by several public options structs, named once so they cannot drift apart.
//
// Thread-safety: constants only.
#pragma once

#include <chrono>
#include <cstddef>

namespace kvferry {

// How long one exchange with a peer's control endpoints may take by default: the p2p
// handshake (EngineOptions::handshake_timeout), one metadata-store call, one PD control
// frame send and one bootstrap HTTP call.
inline constexpr std::chrono::milliseconds kDefaultHandshakeTimeout{2'000};

// Engine notifications: the largest message (EngineOptions::max_notification_bytes) and how
// many received ones are kept until drained (max_pending_notifications).
inline constexpr size_t kDefaultMaxNotificationBytes = 4096;
inline constexpr size_t kDefaultMaxPendingNotifications = 65536;
// And how many bytes they may take (message, sender's name and endpoint, bookkeeping):
// about 7,800 notifications of the default largest size.
inline constexpr size_t kDefaultMaxPendingNotificationBytes = size_t{32} << 20;

// How long one data frame may take as a whole, from its first byte to its last, on either end
// of a data connection (EngineOptions::frame_rest_timeout): a tcp frame, a ucx rendezvous
// receive.
inline constexpr std::chrono::milliseconds kDefaultFrameRestTimeout{10'000};

}  // namespace kvferry
