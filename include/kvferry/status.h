// Status and Result<T>: how every fallible kvferry call reports its outcome.
//
// A Status is a typed code plus a message that names the value that was wrong
// ("address 0x7f00 is outside every registered region"). No kvferry call throws across
// the public API and none aborts on bad input; callers branch on code().
//
// Thread-safety: Status and Result are plain values; distinct objects may be used from
// different threads freely, one object needs external synchronisation like any value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace kvferry {

// Every code has a fixed number: codes travel on the wire (tcp kAck/kReadData status, PD
// control messages) and to Python, so a number is never reused or renumbered. A new code is
// appended after the last one and kLastStatusCode moves to it; decoders accept exactly
// 0..kLastStatusCode.
enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,     // a caller-supplied value is malformed or out of its domain
  kNotRegistered = 2,       // an address lies outside every registered region
  kOutOfRange = 3,          // an index or length runs past the end of what it refers to
  kAlreadyExists = 4,       // e.g. a registration that overlaps an existing one
  kFailedPrecondition = 5,  // the call is valid but the object is not in a state to do it
  kNotSupported = 6,        // the request is well-formed but this build or peer cannot serve it
  kPeerUnreachable = 7,     // the peer could not be contacted at all
  kPeerDisconnected = 8,    // the peer was reachable and has gone away
  kTimeout = 9,
  kCancelled = 10,
  kUnauthenticated = 11,
  kProtocolError = 12,  // a peer sent bytes that do not parse
  kInternal = 13,       // a system call failed in a way the caller cannot fix
  kDataCorrupted = 14,  // bytes arrived but do not match the sender's checksum
};
// The highest code; every number from 0 to it is a valid StatusCode.
inline constexpr StatusCode kLastStatusCode = StatusCode::kDataCorrupted;

// Whether `number` (read off the wire) names a StatusCode.
constexpr bool is_valid_status_code(uint64_t number) {
  return number <= static_cast<uint64_t>(kLastStatusCode);
}

// The code's name without the leading 'k' ("PeerUnreachable").
std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "PeerUnreachable: connect to 127.0.0.1:9 refused".
  std::string to_string() const;

  // Marks a status as deliberately ignored.
  void ignore() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotRegistered(std::string m) { return {StatusCode::kNotRegistered, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status NotSupported(std::string m) { return {StatusCode::kNotSupported, std::move(m)}; }
inline Status PeerUnreachable(std::string m) {
  return {StatusCode::kPeerUnreachable, std::move(m)};
}
inline Status PeerDisconnected(std::string m) {
  return {StatusCode::kPeerDisconnected, std::move(m)};
}
inline Status Timeout(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status Unauthenticated(std::string m) {
  return {StatusCode::kUnauthenticated, std::move(m)};
}
inline Status ProtocolError(std::string m) { return {StatusCode::kProtocolError, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status DataCorrupted(std::string m) { return {StatusCode::kDataCorrupted, std::move(m)}; }

// Internal error carrying strerror(errno_value): "what: No such file or directory".
Status ErrnoStatus(StatusCode code, std::string_view what, int errno_value);

namespace detail {
// Prints "Result::value() on an error: <status>" to stderr and aborts.
[[noreturn]] void die_on_result_without_value(const Status& status);
}  // namespace detail

// Either a T or a non-OK Status. Construct from a value or from an error Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (status_.ok()) status_ = Internal("Result constructed from an OK status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // The value. Calling these on an error is a bug in the caller (check ok() first): it
  // prints the status to stderr and aborts, never undefined behaviour.
  T& value() & { return checked(), *value_; }
  const T& value() const& { return checked(), *value_; }
  T&& value() && { return checked(), std::move(*value_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void checked() const {
    if (!value_.has_value()) detail::die_on_result_without_value(status_);
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace kvferry

// Returns the status from the enclosing function when it is not OK.
#define KVF_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::kvferry::Status kvf_status_ = (expr);    \
    if (!kvf_status_.ok()) return kvf_status_; \
  } while (0)

#define KVF_CONCAT_INNER(a, b) a##b
#define KVF_CONCAT(a, b) KVF_CONCAT_INNER(a, b)
// `KVF_ASSIGN_OR_RETURN(auto x, make_x());` declares x from a Result or returns its error.
#define KVF_ASSIGN_OR_RETURN(lhs, expr) \
  KVF_ASSIGN_OR_RETURN_IMPL(KVF_CONCAT(kvf_result_, __LINE__), lhs, expr)
// NOLINTBEGIN(bugprone-macro-parentheses): `lhs` is a declaration ("auto x"), `tmp` a name.
#define KVF_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)
