// Attackers for the forged-descriptor tests (confused deputy): a fake handshake server run
// as uid 65534 that serves a forged segment descriptor and speaks the cma session protocol on
// the abstract sockets it names, the forged descriptor itself, and a third process whose
// pages this test can see (so that a byte reaching it is seen). Used by the engine's and the
// PD layer's hostile tests. Needs root (the attacker drops to another uid).
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/byte_codec.h"
#include "core/frame_header.h"
#include "core/host_identity.h"
#include "core/net.h"
#include "core/pattern.h"
#include "metadata/handshake.h"
#include "metadata/segment_descriptor.h"
#include "test_support.h"
#include "transport/cma/cma_session_wire.h"

namespace kvferry::testing {

inline constexpr uint64_t kPage = 4096;
inline constexpr size_t kPages = 2;  // one plain host region, one claiming to be shared memory

// Pages this test can see and another process owns: MAP_SHARED before fork.
struct SharedPages {
  SharedPages() {
    void* p =
        ::mmap(nullptr, kPages * kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    bytes = static_cast<std::byte*>(p);
    fill_pattern({bytes, kPages * kPage}, 0xC0FFEE);
  }
  ~SharedPages() { ::munmap(bytes, kPages * kPage); }
  bool untouched() const {
    std::vector<std::byte> expected(kPages * kPage);
    fill_pattern(expected, 0xC0FFEE);
    return std::equal(expected.begin(), expected.end(), bytes);
  }
  uint64_t addr(size_t page) const { return reinterpret_cast<uint64_t>(bytes) + page * kPage; }
  std::byte* bytes = nullptr;
};

// A root process that only holds its (shared) pages until it is killed.
struct Victim {
  Victim() {
    pid = ::fork();
    if (pid == 0) {
      for (;;) ::pause();
    }
  }
  ~Victim() {
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
  SharedPages pages;  // mapped before the fork above (members initialise first)
  pid_t pid = -1;
};

// The forged descriptor: a same-host engine that serves cma and shm, whose pid is `pid`,
// and whose two regions are the given pages (the second one claims an shm backing).
inline SegmentDescriptor forged_descriptor(const std::string& endpoint, int64_t pid, uint64_t page0,
                                           uint64_t page1, const std::string& sockets) {
  SegmentDescriptor d;
  d.name = "forged";
  d.endpoint = endpoint;
  d.incarnation = std::random_device{}() | 1;
  d.host_id = host_identity();
  d.pid = pid;
  d.transports.insert(TransportKind::kCma);
  d.transports.insert(TransportKind::kShm);
  d.cma_socket = "kvferry-cma/" + sockets;
  d.shm_socket = "kvferry-shm/" + sockets;
  d.version = 1;
  d.regions.push_back(RegionDescriptor{page0, kPage, {}, std::nullopt, std::nullopt, {}});
  ShmBacking shm;
  shm.fd = 3;
  shm.file_bytes = 2 * kPage;
  shm.inode = 12345;
  shm.guard_offset = kPage;
  shm.generation = 1;
  d.regions.push_back(RegionDescriptor{page1, kPage, {}, shm, std::nullopt, {}});
  return d;
}

// The attacker: a child that becomes uid 65534 and answers every handshake on its listener
// with the descriptor, asking for no secret. On the abstract sockets the descriptor names it
// listens too, and on the cma one it speaks the session protocol, declaring the forged
// regions under the forged incarnation: only the kernel's word on who listens there (its
// own pid, not the one the descriptor names) can give it away. (The descriptor's own
// endpoint field is not the listener's: nothing checks it, and the attack does not need to.)
class FakeHandshakeServer {
 public:
  FakeHandshakeServer(const std::string& sockets, SegmentDescriptor descriptor)
      : listener_(must(listen_tcp(Endpoint{"127.0.0.1", 0}, &bound_))),
        descriptor_(std::move(descriptor)) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      serve(fds[1], sockets);
    }
    ::close(fds[1]);
    ready_ = read_lines(fds[0], 1, std::chrono::seconds(30))[0];
    ::close(fds[0]);
  }
  ~FakeHandshakeServer() {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  const std::string& ready() const { return ready_; }
  std::string endpoint() const { return bound_.to_string(); }

 private:
  [[noreturn]] void serve(int report, const std::string& sockets) {
    if (!drop_to_nobody()) {
      write_line(report, "cannot drop privileges");
      ::_exit(1);
    }
    auto cma = listen_abstract("kvferry-cma/" + sockets, 16);
    auto shm = listen_abstract("kvferry-shm/" + sockets, 16);
    write_line(report, cma.ok() && shm.ok() ? "ready" : "cannot listen");
    const std::string json = serialize_segment_descriptor(descriptor_);
    for (;;) {
      pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {cma->get(), POLLIN, 0}};
      if (::poll(fds, 2, -1) <= 0) continue;
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      std::byte header[kFrameHeaderBytes];
      if (fds[1].revents != 0) {
        Fd conn(::accept(cma->get(), nullptr, nullptr));
        if (!conn.valid()) continue;
        send_all(conn.get(), make_cma_frame(CmaSessionFrame::kChallenge, {}), deadline).ignore();
        if (!recv_all(conn.get(), header, deadline).ok()) continue;  // Open, empty
        ByteWriter declare;
        declare.put(uint8_t{0});
        declare.put(descriptor_.incarnation);
        declare.put(static_cast<uint32_t>(descriptor_.regions.size()));
        for (const RegionDescriptor& r : descriptor_.regions) {
          declare.put(r.addr);
          declare.put(r.length);
        }
        send_all(conn.get(), make_cma_frame(CmaSessionFrame::kDeclare, declare.bytes()), deadline)
            .ignore();
        sessions_.push_back(std::move(conn));  // held open, as a real engine's would be
        continue;
      }
      Fd conn(::accept(listener_.get(), nullptr, nullptr));
      if (!conn.valid()) continue;
      if (!recv_all(conn.get(), header, deadline).ok()) continue;
      auto request = decode_handshake_header(header, 4096);
      if (!request.ok()) continue;
      std::vector<std::byte> payload(request->length);
      if (!recv_all(conn.get(), payload, deadline).ok()) continue;
      std::vector<std::byte> reply(kHandshakeHeaderBytes + json.size());
      encode_handshake_header({kHandshakeMagic, kHandshakeVersion, HandshakeFrame::kDescriptor,
                               static_cast<uint32_t>(json.size())},
                              reply.data());
      std::memcpy(reply.data() + kHandshakeHeaderBytes, json.data(), json.size());
      send_all(conn.get(), reply, deadline).ignore();
    }
  }

  Endpoint bound_;
  Fd listener_;
  SegmentDescriptor descriptor_;
  std::vector<Fd> sessions_;
  pid_t pid_ = -1;
  std::string ready_;
};

}  // namespace kvferry::testing
