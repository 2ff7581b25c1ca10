// RequestServer: a listener for protocols of one request and one reply per connection (the
// p2p handshake, the bootstrap HTTP server), served by one epoll thread, so that slow or
// idle clients hold a few bytes of state each, never a thread, and cannot make the fast ones
// wait behind them.
//
// The Acceptor (core/acceptor.h) accepts with its limits and back-off and hands each
// connection to the loop. The loop reads what arrives into the connection's own buffer,
// which grows with the bytes received up to `max_request_bytes`, and asks `frame` whether a
// whole request is there. A server whose options name a `greeting` speaks first: the
// greeting (a challenge with a fresh nonce, say) is sent on accept, and `handle` gets it
// back beside the request, so that the one request can answer it. Once it is, `handle` turns it
// into the reply, which is sent without blocking; then the connection is closed. A connection that
// has not received its request and sent its reply within `limits.hello_timeout` of being accepted
// is closed.
//
// A listener at its limits makes room (Acceptor::Options::evict_idle): it closes the oldest
// connection whose request has not arrived whole, from the source that holds the most, so a
// flood of connections that never send a request costs the peers that do send one nothing but
// a place in the queue. A connection whose request is whole is served to the end.
//
// `frame` and `handle` run on the loop thread: they must be quick (no blocking I/O).
//
// Thread-safety: start/destructor from the owner's thread; endpoint(), open_connections(),
// timed_out(), evicted() and refused() from any.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "core/acceptor.h"
#include "core/net.h"
#include "kvferry/listener_limits.h"
#include "kvferry/status.h"

namespace kvferry {

// What `frame` found in the bytes received so far.
struct RequestFraming {
  enum class Kind { kNeedMore, kComplete, kRefuse };
  Kind kind = Kind::kNeedMore;
  size_t request_bytes = 0;  // kComplete: the request is the first this many bytes
  std::string reply;         // kRefuse: sent as is, then the connection is closed

  static RequestFraming need_more() { return {}; }
  static RequestFraming complete(size_t bytes) { return {Kind::kComplete, bytes, {}}; }
  static RequestFraming refuse(std::string reply) { return {Kind::kRefuse, 0, std::move(reply)}; }
};

struct RequestServerOptions {
  std::string name = "listener";  // in log messages
  ListenerLimits limits;          // idle_timeout is unused: hello_timeout bounds a connection
  // A connection whose request is not complete at this many bytes is closed.
  size_t max_request_bytes = size_t{64} << 10;
  // When set: bytes sent to every connection on accept (at most a few hundred: they go out
  // in one non-blocking send); an empty greeting is not sent. Runs on the loop thread.
  std::function<std::string()> greeting;
};

// Who sent a request: the client's IP literal and what it was greeted with.
struct RequestPeer {
  const std::string& source;
  const std::string& greeting;
};

class RequestServer {
 public:
  using Frame = std::function<RequestFraming(std::span<const std::byte> received)>;
  // The reply to a complete request.
  using Handle =
      std::function<std::string(std::span<const std::byte> request, const RequestPeer& peer)>;

  // Listens on `listen` (port 0 picks one) and starts serving.
  static Result<std::unique_ptr<RequestServer>> start(const Endpoint& listen,
                                                      RequestServerOptions options, Frame frame,
                                                      Handle handle);
  ~RequestServer();
  RequestServer(const RequestServer&) = delete;
  RequestServer& operator=(const RequestServer&) = delete;

  const Endpoint& endpoint() const;
  uint32_t open_connections() const;
  // Connections closed for missing their deadline, so far.
  uint64_t timed_out() const;
  // Connections closed before their request was whole to admit newer ones, so far.
  uint64_t evicted() const;
  // Connections closed as soon as accepted for being over a limit, so far.
  uint64_t refused() const;

 private:
  struct Loop;
  explicit RequestServer(std::unique_ptr<Acceptor> acceptor, std::unique_ptr<Loop> loop);

  std::unique_ptr<Acceptor> acceptor_;
  std::unique_ptr<Loop> loop_;
};

}  // namespace kvferry
