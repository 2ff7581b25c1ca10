#include "core/pattern.h"

#include <xxhash.h>

#include <cstring>

namespace kvferry {
namespace {

// splitmix64 of the word index, keyed by the seed: every 8-byte word is independent, so
// any sub-range can be generated or checked on its own.
inline uint64_t pattern_word(uint64_t seed, uint64_t word_index) {
  uint64_t z = seed + (word_index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline std::byte pattern_byte(uint64_t seed, uint64_t pos) {
  uint64_t w = pattern_word(seed, pos / 8);
  return static_cast<std::byte>((w >> (8 * (pos % 8))) & 0xff);
}

}  // namespace

void fill_pattern(std::span<std::byte> out, uint64_t seed, uint64_t offset) {
  size_t i = 0;
  for (; i < out.size() && (offset + i) % 8 != 0; ++i) out[i] = pattern_byte(seed, offset + i);
  for (; i + 8 <= out.size(); i += 8) {
    uint64_t w = pattern_word(seed, (offset + i) / 8);
    std::memcpy(out.data() + i, &w, 8);  // little-endian: byte k of word = bits 8k..8k+7
  }
  for (; i < out.size(); ++i) out[i] = pattern_byte(seed, offset + i);
}

std::optional<size_t> find_pattern_mismatch(std::span<const std::byte> data, uint64_t seed,
                                            uint64_t offset) {
  size_t i = 0;
  auto check_byte = [&](size_t k) { return data[k] == pattern_byte(seed, offset + k); };
  for (; i < data.size() && (offset + i) % 8 != 0; ++i) {
    if (!check_byte(i)) return i;
  }
  for (; i + 8 <= data.size(); i += 8) {
    uint64_t w = pattern_word(seed, (offset + i) / 8);
    if (std::memcmp(data.data() + i, &w, 8) != 0) {
      for (size_t k = i; k < i + 8; ++k) {
        if (!check_byte(k)) return k;
      }
    }
  }
  for (; i < data.size(); ++i) {
    if (!check_byte(i)) return i;
  }
  return std::nullopt;
}

uint64_t checksum(std::span<const std::byte> data) { return XXH3_64bits(data.data(), data.size()); }

StreamingChecksum::StreamingChecksum() : state_(XXH3_createState()) {
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
StreamingChecksum::~StreamingChecksum() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void StreamingChecksum::update(std::span<const std::byte> data) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data.data(), data.size());
}
uint64_t StreamingChecksum::digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

}  // namespace kvferry
