// ProcessFigures (tools/process_figures.h): what `bench scale` reads from /proc/self to count
// a peer's threads, memory and descriptors. Each figure must move by exactly what the process
// did, or the per-peer differences the bench prints are wrong.
#include "process_figures.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <future>
#include <thread>

namespace kvferry::cli {
namespace {

TEST(ParseVmRss, ReadsTheKibOfTheVmRssLine) {
  EXPECT_EQ(parse_vm_rss_kib("Name:\tx\nVmPeak:\t  9 kB\nVmRSS:\t   12345 kB\nThreads:\t3\n"),
            12345u);
  EXPECT_EQ(parse_vm_rss_kib("VmRSS:\t1 kB"), 1u);  // the last line, no newline
}

TEST(ParseVmRss, ReadsZeroWithoutAWellFormedVmRssLine) {
  EXPECT_EQ(parse_vm_rss_kib(""), 0u);
  EXPECT_EQ(parse_vm_rss_kib("VmRSSX:\t12 kB\n"), 0u);  // another key with the same prefix
  EXPECT_EQ(parse_vm_rss_kib("VmHWM:\t12 kB\nThreads:\t3\n"), 0u);
  EXPECT_EQ(parse_vm_rss_kib("VmRSS:\t12 MB\n"), 0u);  // a unit it does not know
  EXPECT_EQ(parse_vm_rss_kib("VmRSS:\tmany kB\n"), 0u);
}

TEST(ProcessFigures, AThreadCountsOneWhileItRuns) {
  // A sanitizer's runtime starts a helper thread at the process's first thread: start one
  // first, so that only the measured thread comes and goes below.
  std::thread([] {}).join();
  const ProcessFigures before = read_process_figures();
  ASSERT_GE(before.threads, 1u);
  std::promise<void> started, release;
  std::thread t([&] {
    started.set_value();
    release.get_future().wait();
  });
  started.get_future().wait();
  EXPECT_EQ(read_process_figures().threads, before.threads + 1);
  release.set_value();
  t.join();
  EXPECT_EQ(read_process_figures().threads, before.threads);
}

TEST(ProcessFigures, AnOpenDescriptorCountsOne) {
  const ProcessFigures before = read_process_figures();
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(read_process_figures().fds, before.fds + 1);
  ::close(fd);
  EXPECT_EQ(read_process_figures().fds, before.fds);
}

TEST(ProcessFigures, TouchedPagesCountInResidentMemory) {
  constexpr size_t kBytes = 16u << 20;
  void* area = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(area, MAP_FAILED);
  const ProcessFigures before = read_process_figures();
  ASSERT_GT(before.rss_kib, 0u);
  std::memset(area, 1, kBytes);
  const ProcessFigures after = read_process_figures();
  // Every touched page is resident now; the rest of the process may move by a little.
  EXPECT_GE(after.rss_kib, before.rss_kib + kBytes / 1024 - 1024);
  ::munmap(area, kBytes);
}

}  // namespace
}  // namespace kvferry::cli
