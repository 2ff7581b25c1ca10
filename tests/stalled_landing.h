// A write whose landing on the target stalls on a page that a userfaultfd holds back, as a
// receiving thread descheduled mid-copy would sit. A wait_for_landings() begun meanwhile
// must not return until the page is given and the copy ends; then every byte is in place.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <span>
#include <thread>
#include <vector>

#include "core/fd.h"
#include "core/pattern.h"
#include "kvferry/transfer_engine.h"
#include "mapped_pages.h"
#include "transport/landing_fence.h"

namespace kvferry::testing {

// Writes `src` (filled here) over `peer` into the start of `dst`, which the target engine
// registered and nothing touched yet, and stalls the target's landing on the first page it
// finds missing.
// Skips the test where the kernel refuses a userfaultfd that sees its own copies' faults
// (that needs privilege).
inline void expect_wait_for_landings_outlasts_a_stalled_write(TransferEngine& initiator,
                                                              const PeerHandle& peer,
                                                              std::span<std::byte> src,
                                                              const AnonymousPages& dst) {
  ASSERT_LE(src.size(), dst.size());
  fill_pattern(src, 23);
  const int uffd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (uffd < 0) GTEST_SKIP() << "userfaultfd refused: " << std::strerror(errno);
  const Fd uffd_owner(uffd);
  uffdio_api api{};
  api.api = UFFD_API;
  ASSERT_EQ(::ioctl(uffd, UFFDIO_API, &api), 0) << std::strerror(errno);
  uffdio_register reg{};
  reg.range = {reinterpret_cast<uint64_t>(dst.data()), dst.size()};
  reg.mode = UFFDIO_REGISTER_MODE_MISSING;
  ASSERT_EQ(::ioctl(uffd, UFFDIO_REGISTER, &reg), 0) << std::strerror(errno);

  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()),
                reinterpret_cast<uint64_t>(dst.data()), src.size()};
  Result<BatchHandle> batch = initiator.submit(peer, {&op, 1});
  ASSERT_TRUE(batch.ok()) << batch.status().to_string();
  pollfd pfd{uffd, POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 10'000), 1) << "the target never touched its memory";
  uffd_msg fault{};
  ASSERT_EQ(::read(uffd, &fault, sizeof fault), static_cast<ssize_t>(sizeof fault));
  ASSERT_EQ(fault.event, UFFD_EVENT_PAGEFAULT);

  std::promise<size_t> found;
  std::atomic<bool> served{false}, returned{false}, served_at_return{false};
  std::thread waiter([&] {
    wait_for_landings([&](size_t open) { found.set_value(open); });
    served_at_return.store(served.load());
    returned.store(true);
  });
  std::future<size_t> seen = found.get_future();
  if (seen.wait_for(std::chrono::seconds(10)) == std::future_status::ready) {
    EXPECT_GE(seen.get(), 1u);  // the stalled landing's window
  } else {
    ADD_FAILURE() << "the wait never began";
  }
  // The landing cannot go on until its page is given, so the wait cannot have returned.
  EXPECT_FALSE(returned.load());
  // Every missing page (as zeros), then the landing goes on; a page the engine touched
  // before the userfaultfd was registered is there already.
  served.store(true);
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<std::byte> zeros(page);
  for (size_t at = 0; at < dst.size(); at += page) {
    uffdio_copy copy{};
    copy.dst = reinterpret_cast<uint64_t>(dst.data() + at);
    copy.src = reinterpret_cast<uint64_t>(zeros.data());
    copy.len = page;
    EXPECT_TRUE(::ioctl(uffd, UFFDIO_COPY, &copy) == 0 || errno == EEXIST) << std::strerror(errno);
  }
  waiter.join();
  EXPECT_TRUE(served_at_return.load());
  BatchStatus done = initiator.wait(*batch, std::chrono::seconds(30));
  ASSERT_EQ(done.state, BatchState::kCompleted) << done.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch({dst.data(), src.size()}, 23));
}

}  // namespace kvferry::testing
