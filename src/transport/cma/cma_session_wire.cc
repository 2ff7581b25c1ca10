#include "transport/cma/cma_session_wire.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kvferry {

std::vector<std::byte> make_cma_frame(CmaSessionFrame type, std::span<const std::byte> payload) {
  return make_frame(kCmaSessionFormat, static_cast<uint16_t>(type), payload);
}

void put_cma_ranges(ByteWriter& w, std::span<const CmaRange> ranges) {
  w.put(static_cast<uint32_t>(ranges.size()));
  for (const CmaRange& r : ranges) {
    w.put(r.addr);
    w.put(r.length);
  }
}

bool get_cma_ranges(ByteReader& r, std::vector<CmaRange>& out) {
  uint32_t n = 0;
  if (!r.get_count(n, kCmaRangeBytes)) return false;
  out.resize(n);
  for (CmaRange& range : out) {
    if (!r.get(range.addr) || !r.get(range.length)) return false;
    if (range.length == 0 || range.addr + range.length < range.addr) return false;
  }
  return true;
}

std::vector<std::byte> cma_declare_frame(const Status& status, uint64_t incarnation,
                                         std::span<const CmaRange> ranges) {
  ByteWriter w;
  w.put(static_cast<uint8_t>(status.code()));
  if (status.ok()) {
    w.put(incarnation);
    put_cma_ranges(w, ranges);
  } else {
    w.put_string(status.message().substr(0, 1024));
  }
  return make_cma_frame(CmaSessionFrame::kDeclare, w.bytes());
}

bool send_now(int fd, std::span<const std::byte> frame) {
  for (;;) {
    const ssize_t n = ::send(fd, frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    return n == static_cast<ssize_t>(frame.size());
  }
}

bool receive_available(int fd, std::vector<std::byte>& inbox, size_t limit, std::string& why) {
  std::byte buffer[4096];
  while (inbox.size() < limit) {
    const size_t room = std::min(sizeof(buffer), limit - inbox.size());
    const ssize_t n = ::recv(fd, buffer, room, MSG_DONTWAIT);
    if (n > 0) {
      inbox.insert(inbox.end(), buffer, buffer + n);
      continue;
    }
    if (n == 0) {
      why = "the other side closed the session";
      return false;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    why = std::strerror(errno);
    return false;
  }
  return true;
}

}  // namespace kvferry
