// The byte codec of every kvferry binary format: fixed-width little-endian integers,
// strings as a u32 length and bytes, counts before lists.
//
// Every binary format kvferry speaks is little-endian (the tcp data frames, the p2p
// handshake frames and the PD control messages; docs/PROTOCOL.md). The byte order is
// written out here, byte by byte, rather than left to memcpy of host integers, so the
// formats mean the same on any host; compilers turn the loops into single moves.
//
// ByteWriter appends to a buffer it owns; FixedByteWriter fills a caller's fixed-size
// buffer (a frame header, no allocation). ByteReader never reads past its span: a get that
// does not fit returns false and latches ok() to false, and counts of items are checked
// against what is left before anyone allocates for them, so a hostile count never drives an
// allocation.
//
// Hand-written because the formats are a handful of integers and lists, and a bounded reader
// of our own keeps each decoder a pure, allocation-checked function a fuzzer can drive.
//
// Thread-safety: plain values; one object per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvferry {

// Stores `value` at `out` as sizeof(T) little-endian bytes.
template <typename T>
constexpr void store_le(std::byte* out, T value) {
  static_assert(std::is_integral_v<T>);
  const auto bits = static_cast<std::make_unsigned_t<T>>(value);
  for (size_t i = 0; i < sizeof(T); ++i) {
    out[i] = static_cast<std::byte>((static_cast<uint64_t>(bits) >> (8 * i)) & 0xff);
  }
}

// Loads sizeof(T) little-endian bytes from `in`.
template <typename T>
constexpr T load_le(const std::byte* in) {
  static_assert(std::is_integral_v<T>);
  uint64_t bits = 0;
  for (size_t i = 0; i < sizeof(T); ++i) bits |= static_cast<uint64_t>(in[i]) << (8 * i);
  return static_cast<T>(static_cast<std::make_unsigned_t<T>>(bits));
}

class ByteWriter {
 public:
  template <typename T>
  void put(T value) {
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    store_le(out_.data() + at, value);
  }
  void put_bytes(std::span<const std::byte> bytes) {
    out_.insert(out_.end(), bytes.begin(), bytes.end());
  }
  // u32 length, then the bytes.
  void put_string(std::string_view s) {
    put(static_cast<uint32_t>(s.size()));
    put_bytes(std::as_bytes(std::span(s.data(), s.size())));
  }
  // Overwrites sizeof(T) bytes at `offset`, which must already be written (a length that is
  // only known once the rest has been appended).
  template <typename T>
  void patch(size_t offset, T value) {
    store_le(out_.data() + offset, value);
  }

  size_t size() const { return out_.size(); }
  std::vector<std::byte>& bytes() { return out_; }
  std::vector<std::byte> take() && { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

// Writes into a fixed buffer; a put that does not fit writes nothing and latches ok() false.
class FixedByteWriter {
 public:
  explicit FixedByteWriter(std::span<std::byte> out) : out_(out) {}

  template <typename T>
  bool put(T value) {
    if (out_.size() - pos_ < sizeof(T)) {
      ok_ = false;
      return false;
    }
    store_le(out_.data() + pos_, value);
    pos_ += sizeof(T);
    return true;
  }
  size_t written() const { return pos_; }
  bool ok() const { return ok_; }

 private:
  std::span<std::byte> out_;
  size_t pos_ = 0;
  bool ok_ = true;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const std::byte> in) : in_(in) {}

  template <typename T>
  bool get(T& value) {
    static_assert(std::is_integral_v<T>);
    if (remaining() < sizeof(T)) return fail();
    value = load_le<T>(in_.data() + pos_);
    pos_ += sizeof(T);
    return true;
  }
  // A u32 length, then that many bytes; refused when longer than `max_bytes` or than what
  // is left.
  bool get_string(std::string& s, uint32_t max_bytes) {
    uint32_t n = 0;
    if (!get(n) || n > max_bytes || n > remaining()) return fail();
    s.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  // Reads a u32 count of items of at least `min_item_bytes` each, refusing counts that
  // cannot fit in what is left.
  bool get_count(uint32_t& n, size_t min_item_bytes) {
    if (!get(n)) return false;
    if (min_item_bytes > 0 && n > remaining() / min_item_bytes) return fail();
    return true;
  }
  // Steps over `n` bytes (reserved fields).
  bool skip(size_t n) {
    if (remaining() < n) return fail();
    pos_ += n;
    return true;
  }

  size_t remaining() const { return in_.size() - pos_; }
  bool ok() const { return ok_; }

 private:
  bool fail() {
    ok_ = false;
    return false;
  }

  std::span<const std::byte> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace kvferry
