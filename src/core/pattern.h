// Verifiable test data: a deterministic, position-dependent pseudo-random pattern that
// any process can regenerate from (seed, offset) alone, so a receiver verifies bytes
// without being sent the expected copy. Used by tests, the demo and benchmarks.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace kvferry {

// Fills `out` with the pattern for `seed`, as if `out` began at byte `offset` of an
// infinite stream.
void fill_pattern(std::span<std::byte> out, uint64_t seed, uint64_t offset = 0);

// The index of the first byte of `data` that differs from the pattern, or nullopt.
std::optional<size_t> find_pattern_mismatch(std::span<const std::byte> data, uint64_t seed,
                                            uint64_t offset = 0);

// 64-bit XXH3 of the bytes.
uint64_t checksum(std::span<const std::byte> data);

// 64-bit XXH3 of several byte ranges as if they were one: digest() equals checksum() of their
// concatenation. Not thread-safe (one object, one thread).
class StreamingChecksum {
 public:
  StreamingChecksum();
  ~StreamingChecksum();
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;
  void update(std::span<const std::byte> data);
  uint64_t digest() const;

 private:
  void* state_;  // XXH3_state_t, kept out of this header
};

}  // namespace kvferry
