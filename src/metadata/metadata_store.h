// MetadataStore: where engines publish their segment descriptors and find each other's.
// Chosen by a URI, parsed once at the edge (open_metadata_store):
//
//   p2p                            embedded handshake: each engine serves its own descriptor
//                                  (no server; the default)
//   etcd://host:port[,host:port]   etcd v3 through its JSON gateway; the record is attached
//                                  to a lease this engine keeps alive, so a dead engine's
//                                  record disappears after the lease TTL
//   redis://host:port              Redis; the record has a TTL this engine keeps refreshing
//
// Records are keyed by the engine's endpoint ("host:port"), which is also the peer name
// users pass to open_peer.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/net.h"
#include "kvferry/defaults.h"
#include "kvferry/status.h"

namespace kvferry {

struct MetadataStoreOptions {
  std::chrono::seconds record_ttl{10};
  std::chrono::milliseconds io_timeout = kDefaultHandshakeTimeout;
  // p2p: proved to peers whose handshake asks for it, and required of them (core/auth.h).
  // etcd and Redis: every record is signed with it (HMAC over key and descriptor), and a
  // record without a valid signature is refused (Unauthenticated). Without a secret, anyone
  // who can write to the store can publish a descriptor under any name.
  std::optional<std::string> secret;
};

class MetadataStore {
 public:
  virtual ~MetadataStore() = default;
  // The URI it was opened with (for messages).
  virtual const std::string& uri() const = 0;
  // Makes `json` the descriptor published under `key` (replacing any earlier one) and keeps
  // it alive until the store is destroyed, which removes it.
  virtual Status publish(const std::string& key, const std::string& json) = 0;
  // The descriptor published under `key`. PeerUnreachable when there is none (or the
  // store or peer does not answer before the deadline).
  virtual Result<std::string> fetch(const std::string& key, Clock::time_point deadline) = 0;
};

// Errors name the URI and list the valid schemes; an unreachable store is an error here,
// at open, not later.
Result<std::unique_ptr<MetadataStore>> open_metadata_store(std::string_view uri,
                                                           const MetadataStoreOptions& options);

// The key a descriptor is stored under in etcd and Redis.
std::string metadata_key(std::string_view endpoint);

}  // namespace kvferry
