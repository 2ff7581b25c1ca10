// The README's engine example, compiled and run by CI: two engines on this machine, one
// WRITE from the prefill engine's memory into the decode engine's shared memory, every
// byte checked. Exit code 0 only when the bytes arrived.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kvferry/transfer_engine.h"

using namespace kvferry;

namespace {

uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

int fail(const Status& s) {
  std::fprintf(stderr, "engine_example: %s\n", s.to_string().c_str());
  return 1;
}

}  // namespace

int main() {
  constexpr size_t bytes = 64 << 20;
  EngineOptions options;  // defaults: p2p metadata, loopback listener, every built transport
  options.name = "decode";
  Result<std::unique_ptr<TransferEngine>> decode = TransferEngine::create(options);
  if (!decode.ok()) return fail(decode.status());
  Result<SharedBuffer> kv = (*decode)->allocate_shared(bytes);  // same-host peers reach it
  if (!kv.ok()) return fail(kv.status());

  options.name = "prefill";
  Result<std::unique_ptr<TransferEngine>> prefill = TransferEngine::create(options);
  if (!prefill.ok()) return fail(prefill.status());
  std::vector<unsigned char> src(bytes);
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  if (Status s = (*prefill)->register_memory(src.data(), bytes); !s.ok()) return fail(s);

  // One host: the route to shared memory is shm.
  Result<PeerHandle> peer = (*prefill)->open_peer((*decode)->endpoint());
  if (!peer.ok()) return fail(peer.status());
  std::vector<TransferOp> ops = {{OpKind::kWrite, addr(src.data()), addr(kv->addr), bytes}};
  Result<BatchHandle> batch = (*prefill)->submit(*peer, ops);
  if (!batch.ok()) return fail(batch.status());
  BatchStatus done = (*prefill)->wait(*batch, std::chrono::seconds(5));
  if (done.state != BatchState::kCompleted) return fail(done.status);

  if (std::memcmp(kv->addr, src.data(), bytes) != 0) {
    std::fprintf(stderr, "engine_example: the bytes that arrived differ from those sent\n");
    return 1;
  }
  std::printf("engine_example: %zu bytes over %s in %.3f ms, every byte verified\n", bytes,
              std::string(transport_kind_name(peer->transport())).c_str(),
              std::chrono::duration<double, std::milli>(done.telemetry.complete_time).count());
  return 0;
}
