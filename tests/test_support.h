// Helpers shared by kvferry tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "kvferry/status.h"
#include "kvferry/transfer_engine.h"

namespace kvferry::testing {

// Unwraps a Result in a test, failing it with the status when it is an error.
template <typename T>
T must(Result<T> r) {
  if (!r.ok()) {
    ADD_FAILURE() << r.status().to_string();
    throw std::runtime_error(r.status().to_string());
  }
  return std::move(r).value();
}

inline std::unique_ptr<TransferEngine> make_engine(const std::string& name, int threads = 2,
                                                   std::optional<std::string> secret = {}) {
  EngineOptions options;
  options.name = name;
  options.worker_threads = threads;
  options.secret = std::move(secret);
  return must(TransferEngine::create(options));
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace kvferry::testing
