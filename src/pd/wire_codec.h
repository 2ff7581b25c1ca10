// ByteWriter / ByteReader: little-endian fixed-width fields for control messages. The reader
// never reads past its span: each get returns false and latches an error instead.
// Hand-written because the format is a handful of integers and lists, and a bounded reader
// of our own keeps the decoder a pure, allocation-checked function that a fuzzer can drive.
//
// Thread-safety: one object per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace kvferry::pd::wire {

class ByteWriter {
 public:
  template <typename T>
  void put(T value) {
    static_assert(std::is_integral_v<T>);
    for (size_t i = 0; i < sizeof(T); ++i) {
      out_.push_back(static_cast<std::byte>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff));
    }
  }
  void put_string(const std::string& s) {
    put(static_cast<uint32_t>(s.size()));
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_.insert(out_.end(), p, p + s.size());
  }
  std::vector<std::byte>& bytes() { return out_; }

 private:
  std::vector<std::byte> out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const std::byte> in) : in_(in) {}

  template <typename T>
  bool get(T& value) {
    static_assert(std::is_integral_v<T>);
    if (remaining() < sizeof(T)) return fail();
    uint64_t v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      v |= static_cast<uint64_t>(in_[pos_ + i]) << (8 * i);
    }
    pos_ += sizeof(T);
    value = static_cast<T>(v);
    return true;
  }
  bool get_string(std::string& s, uint32_t max_bytes) {
    uint32_t n = 0;
    if (!get(n) || n > max_bytes || n > remaining()) return fail();
    s.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  // Reads a count of items of at least `min_item_bytes` each, refusing counts that cannot
  // fit in what is left (so a hostile count never drives an allocation).
  bool get_count(uint32_t& n, size_t min_item_bytes) {
    if (!get(n)) return false;
    if (min_item_bytes > 0 && n > remaining() / min_item_bytes) return fail();
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

}  // namespace kvferry::pd::wire
