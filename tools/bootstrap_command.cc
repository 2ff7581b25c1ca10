// `kvferry bootstrap`: a standalone bootstrap server for one prefill instance (what
// `kvferry demo` runs in its own process), for deployments that start prefill ranks
// separately. Prints {"ready": true, "address": "host:port", "pid": N} once listening, then
// serves until stdin reaches end of input (unless --ignore-stdin) or SIGTERM/SIGINT arrives.
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/fd.h"
#include "kvferry/pd/bootstrap.h"

namespace kvferry::cli {
namespace {

struct BootstrapArgs {
  std::string listen = "127.0.0.1:0";
  int rank_stale_after_ms = 0;
  bool ignore_stdin = false;
};

// Why serve() returned.
enum class StopReason : uint8_t { kEndOfInput, kSignal };

// Waits for end of input on stdin (when watched) or a signal in `signals` (blocked by the
// caller, so it is only ever delivered here).
Result<StopReason> wait_for_stop(const sigset_t& signals, bool watch_stdin) {
  Fd signal_fd(::signalfd(-1, &signals, SFD_CLOEXEC));
  if (!signal_fd.valid()) return Internal(fmt::format("signalfd: errno {}", errno));
  pollfd fds[2] = {{signal_fd.get(), POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
  char discard[4096];
  for (;;) {
    if (::poll(fds, watch_stdin ? 2 : 1, -1) < 0) {
      if (errno == EINTR) continue;
      return Internal(fmt::format("poll: errno {}", errno));
    }
    if (fds[0].revents != 0) return StopReason::kSignal;
    if (watch_stdin && fds[1].revents != 0) {
      // Lines on stdin mean nothing; only its end does.
      if (::read(STDIN_FILENO, discard, sizeof discard) <= 0) return StopReason::kEndOfInput;
    }
  }
}

int run_bootstrap(const BootstrapArgs& args) {
  auto fail = [](const Status& s) {
    std::cerr << "kvferry bootstrap: " << s.to_string() << "\n";
    return 1;
  };
  if (args.rank_stale_after_ms < 0) {
    return fail(InvalidArgument(
        fmt::format("--rank-stale-after-ms {} is negative", args.rank_stale_after_ms)));
  }
  // Blocked before the server starts its threads, which inherit the mask: the signals then
  // reach only the signalfd below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  ::pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  pd::BootstrapServerOptions options;
  options.listen_address = args.listen;
  options.rank_stale_after = std::chrono::milliseconds(args.rank_stale_after_ms);
  auto server = pd::BootstrapServer::start(options);
  if (!server.ok()) return fail(server.status());
  std::cout << nlohmann::json{{"ready", true},
                              {"address", (*server)->address()},
                              {"pid", ::getpid()}}
                   .dump()
            << std::endl;
  Result<StopReason> why = wait_for_stop(signals, !args.ignore_stdin);
  (*server)->stop();
  if (!why.ok()) return fail(why.status());
  std::cerr << "kvferry bootstrap: " << (*why == StopReason::kSignal ? "signalled" : "end of input")
            << ", stopped\n";
  return 0;
}

}  // namespace

void add_bootstrap_command(CLI::App& app) {
  auto args = std::make_shared<BootstrapArgs>();
  CLI::App* cmd =
      app.add_subcommand("bootstrap", "standalone bootstrap server of one prefill instance (HTTP)");
  cmd->add_option("--listen", args->listen, "host:port to listen on (port 0: any free port)");
  cmd->add_option("--rank-stale-after-ms", args->rank_stale_after_ms,
                  "report a rank dead when it has not re-registered for this long (0: never)");
  cmd->add_flag("--ignore-stdin", args->ignore_stdin,
                "run until SIGTERM/SIGINT only (stdin may be /dev/null)");
  cmd->callback([args] {
    int rc = run_bootstrap(*args);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvferry::cli
