// Plain loopback round trip: client sends `bytes`, server replies 1 byte. p50 over iterations.
// usage: rt bytes iters pin(none|same|split) wait(block|spin)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  sched_setaffinity(0, sizeof s, &s);
}
static bool spin;
static void recv_all(int fd, char* p, size_t n) {
  while (n) {
    ssize_t r = recv(fd, p, n, spin ? MSG_DONTWAIT : MSG_WAITALL);
    if (r > 0) {
      p += r;
      n -= r;
    } else if (r == 0)
      exit(0);
    else if (errno != EAGAIN) {
      perror("recv");
      exit(1);
    }
  }
}
int main(int argc, char** argv) {
  size_t bytes = atol(argv[1]);
  int iters = atoi(argv[2]);
  std::string pm = argv[3];
  spin = std::string(argv[4]) == "spin";
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(ls, (sockaddr*)&a, sizeof a);
  listen(ls, 1);
  socklen_t l = sizeof a;
  getsockname(ls, (sockaddr*)&a, &l);
  std::vector<char> buf(bytes, 1);
  if (fork() == 0) {
    if (pm == "same")
      pin(0);
    else if (pm == "split")
      pin(1);
    int fd = accept(ls, nullptr, nullptr);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (;;) {
      recv_all(fd, buf.data(), bytes);
      char c = 1;
      send(fd, &c, 1, 0);
    }
  }
  if (pm != "none") pin(0);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  connect(fd, (sockaddr*)&a, sizeof a);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    send(fd, buf.data(), bytes, 0);
    char c;
    recv_all(fd, &c, 1);
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  close(fd);
  wait(nullptr);
  std::sort(us.begin(), us.end());
  printf("%zu B pin=%s wait=%s p50 %.1f us p10 %.1f p90 %.1f\n", bytes, pm.c_str(), argv[4],
         us[us.size() / 2], us[us.size() / 10], us[us.size() * 9 / 10]);
}
