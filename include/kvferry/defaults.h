// Defaults shared by several public options structs, named once so they cannot drift apart.
//
// Thread-safety: constants only.
#pragma once

#include <chrono>

namespace kvferry {

// How long one exchange with a peer's control endpoints may take by default: the p2p
// handshake (EngineOptions::handshake_timeout), one metadata-store call, one PD control
// frame send and one bootstrap HTTP call.
inline constexpr std::chrono::milliseconds kDefaultHandshakeTimeout{2'000};

}  // namespace kvferry
