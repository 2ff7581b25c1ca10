#include "engine/route_choice.h"

#include <fmt/format.h>

#include "core/logging.h"
#include "engine/peer_state.h"

namespace kvferry::detail {
namespace {

std::string_view place_name(PeerPlace place) {
  switch (place) {
    case PeerPlace::kSelf: return "this engine";
    case PeerPlace::kSameHost: return "same host";
    case PeerPlace::kOtherHost: return "other host";
  }
  return "unknown";
}

std::string route_name(RouteKey key) {
  return fmt::format("{} memory to the peer's {} memory", memory_kind_name(key.local),
                     memory_kind_name(key.remote));
}

}  // namespace

Route choose_route(RouteKey key, const SegmentDescriptor& peer, const RouteChoiceInput& input) {
  Route route{key.local, key.remote, std::nullopt, ""};
  auto why_not = [&](TransportKind kind) -> std::string {
    const auto i = static_cast<size_t>(kind);
    const Transport* t = i < input.served.size() ? input.served[i] : nullptr;
    if (t == nullptr) return "this engine does not serve it";
    if (!peer.transports.contains(kind)) return "the peer does not serve it";
    if (i < input.link_errors.size() && !input.link_errors[i].empty()) {
      return input.link_errors[i];
    }
    return t->why_not(key, input.place, peer);
  };
  if (input.forced) {
    std::string reason = why_not(*input.forced);
    if (reason.empty()) {
      route.transport = input.forced;
      route.reason = "forced";
    } else {
      route.reason = fmt::format("forced transport {} cannot carry {}: {}",
                                 transport_kind_name(*input.forced), route_name(key), reason);
    }
    return route;
  }
  std::string reasons;
  std::string link_refusals;  // better candidates whose link failed: the chosen route says so
  for (TransportKind kind : kRoutePreference) {
    const auto i = static_cast<size_t>(kind);
    if (i >= input.served.size()) continue;
    std::string reason = why_not(kind);
    if (reason.empty()) reason = input.served[i]->why_not_preferred(key, input.place, peer);
    if (reason.empty()) {
      route.transport = kind;
      route.reason =
          fmt::format("{}, both serve {}", place_name(input.place), transport_kind_name(kind));
      if (!link_refusals.empty()) route.reason += "; passed over " + link_refusals;
      return route;
    }
    if (i < input.link_errors.size() && !input.link_errors[i].empty()) {
      link_refusals += fmt::format("{}{}: {}", link_refusals.empty() ? "" : "; ",
                                   transport_kind_name(kind), reason);
    }
    // Transports this build lacks are not candidates worth listing.
    if (input.served[i] == nullptr && !peer.transports.contains(kind)) continue;
    reasons +=
        fmt::format("{}{}: {}", reasons.empty() ? "" : "; ", transport_kind_name(kind), reason);
  }
  route.reason = fmt::format("no transport carries {} ({}): {}", route_name(key),
                             place_name(input.place), reasons.empty() ? "none served" : reasons);
  return route;
}

const Route& RouteTable::get(RouteKey key) {
  const size_t i = route_index(key);
  if (const Route* r = ready_[i].load(std::memory_order_acquire)) return *r;
  std::lock_guard lock(mu_);
  if (!routes_[i]) {
    routes_[i] = choose_(key);
    const Route& r = *routes_[i];
    if (r.transport) {
      log().info("peer {}: route {} -> {}: {} ({})", peer_name_, memory_kind_name(r.local),
                 memory_kind_name(r.remote), transport_kind_name(*r.transport), r.reason);
    } else {
      log().warn("peer {}: route {} -> {}: none ({})", peer_name_, memory_kind_name(r.local),
                 memory_kind_name(r.remote), r.reason);
    }
    ready_[i].store(&*routes_[i], std::memory_order_release);
  }
  return *routes_[i];
}

}  // namespace kvferry::detail
