#include "kvferry/status.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvferry {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotRegistered: return "NotRegistered";
    case StatusCode::kOutOfRange: return "OutOfRange";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kNotSupported: return "NotSupported";
    case StatusCode::kPeerUnreachable: return "PeerUnreachable";
    case StatusCode::kPeerDisconnected: return "PeerDisconnected";
    case StatusCode::kTimeout: return "Timeout";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kUnauthenticated: return "Unauthenticated";
    case StatusCode::kProtocolError: return "ProtocolError";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kDataCorrupted: return "DataCorrupted";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  std::string out(status_code_name(code_));
  out += ": ";
  out += message_;
  return out;
}

Status ErrnoStatus(StatusCode code, std::string_view what, int errno_value) {
  std::string message(what);
  message += ": ";
  message += std::strerror(errno_value);
  return {code, std::move(message)};
}

namespace detail {

void die_on_result_without_value(const Status& status) {
  std::fprintf(stderr, "kvferry: Result::value() called on an error: %s\n",
               status.to_string().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace detail
}  // namespace kvferry
