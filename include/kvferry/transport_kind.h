// TransportKind: the typed name of a way to move bytes. Strings appear only at the edges
// (CLI flags, config, metadata JSON) and are parsed once with parse_transport_kind.
//
// Thread-safety: pure functions, safe from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "kvferry/status.h"

namespace kvferry {

enum class TransportKind : uint8_t {
  kLocal = 0,  // both sides in this process: memcpy
  kShm,        // same host, another process: copy through a shared mapping
  kTcp,        // another host over TCP
  kCudaIpc,    // same host GPU memory through CUDA IPC handles
  kRdma,       // planned
  kCma,        // same host, any host memory: cross-memory attach (process_vm_writev/readv)
  kUcx,        // another host (or this one) through UCX: RDMA verbs where present
};

inline constexpr std::array<TransportKind, 7> kAllTransportKinds = {
    TransportKind::kLocal, TransportKind::kShm, TransportKind::kTcp, TransportKind::kCudaIpc,
    TransportKind::kRdma,  TransportKind::kCma, TransportKind::kUcx};

// "local", "shm", "tcp", "cuda_ipc", "rdma", "cma", "ucx".
std::string_view transport_kind_name(TransportKind kind);

// Parses one of the names above; the error names the bad value and lists the valid ones.
Result<TransportKind> parse_transport_kind(std::string_view name);

// A set of transport kinds, as a bitmask.
class TransportSet {
 public:
  constexpr TransportSet() = default;
  constexpr TransportSet(std::initializer_list<TransportKind> kinds) {
    for (TransportKind k : kinds) insert(k);
  }
  static constexpr TransportSet from_bits(uint32_t bits) {
    TransportSet s;
    s.bits_ = bits;
    return s;
  }
  constexpr void insert(TransportKind k) { bits_ |= bit(k); }
  constexpr void erase(TransportKind k) { bits_ &= ~bit(k); }
  constexpr bool contains(TransportKind k) const { return (bits_ & bit(k)) != 0; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr uint32_t bits() const { return bits_; }
  constexpr TransportSet intersect(TransportSet o) const { return from_bits(bits_ & o.bits_); }
  friend constexpr bool operator==(TransportSet, TransportSet) = default;

 private:
  static constexpr uint32_t bit(TransportKind k) { return 1u << static_cast<uint32_t>(k); }
  uint32_t bits_ = 0;
};

}  // namespace kvferry
