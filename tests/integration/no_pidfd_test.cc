// Hosts where pidfd_open is refused: a kernel older than 5.3 (ENOSYS), or a container whose
// seccomp profile refuses the system calls it does not know (EPERM, as older Docker profiles
// do). The README's main job runs there under a seccomp filter that refuses pidfd_open alone:
// same-host peers still open, and every page arrives and is verified.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvferry {
namespace {

#if defined(__x86_64__)
constexpr uint32_t kThisArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kThisArch = AUDIT_ARCH_AARCH64;
#endif

struct Finished {
  int exit_code = -1;  // -1: killed at the deadline
  std::string out;     // its standard output
};

// Runs `args` (argv[0] a path) with pidfd_open refused as `refusal` (an errno), for it and
// every process it starts; its standard output comes back. Killed after `limit`.
Finished run_without_pidfd_open(int refusal, std::vector<std::string> args,
                                std::chrono::seconds limit) {
  std::array<sock_filter, 7> filter{{
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kThisArch, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_pidfd_open, 0, 1),
      BPF_STMT(BPF_RET | BPF_K,
               SECCOMP_RET_ERRNO | (static_cast<uint32_t>(refusal) & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  }};
  const sock_fprog program{static_cast<unsigned short>(filter.size()), filter.data()};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::array<int, 2> pipe_fds{};
  if (::pipe2(pipe_fds.data(), O_CLOEXEC) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {  // only async-signal-safe calls until exec
    ::dup2(pipe_fds[1], STDOUT_FILENO);
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
      ::_exit(126);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  Finished finished;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{pipe_fds[0], POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      ::kill(pid, SIGKILL);
      break;
    }
    std::array<char, 4096> chunk{};
    const ssize_t n = ::read(pipe_fds[0], chunk.data(), chunk.size());
    if (n <= 0) break;  // it closed its output: it is done
    finished.out.append(chunk.data(), static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) finished.exit_code = WEXITSTATUS(status);
  return finished;
}

TEST(NoPidfd, SameHostPeersOpenAndEveryPageArrivesWhereTheKernelRefusesPidfdOpen) {
  for (const int refusal : {ENOSYS, EPERM}) {
    for (const char* transport : {"shm", "cma"}) {
      SCOPED_TRACE(std::string(transport) + ", pidfd_open refused with errno " +
                   std::to_string(refusal));
      Finished demo = run_without_pidfd_open(
          refusal,
          {KVFERRY_CLI_PATH, "demo", "--json", "--requests", "8", "--transport", transport},
          std::chrono::seconds(120));
      ASSERT_EQ(demo.exit_code, 0) << demo.out;
      auto summary = nlohmann::json::parse(demo.out, nullptr, false);
      ASSERT_FALSE(summary.is_discarded()) << demo.out;
      EXPECT_EQ(summary["succeeded"], 8) << summary["first_error"];
      EXPECT_EQ(summary["failed"], 0);
      EXPECT_GE(summary["pages_verified"].get<uint64_t>(), 8u);
      EXPECT_EQ(summary["corrupt_pages"], 0);
      EXPECT_GT(summary["transport_bytes"][transport].get<uint64_t>(), 0u) << demo.out;
    }
  }
}

}  // namespace
}  // namespace kvferry
