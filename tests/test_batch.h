// TestBatch: a batch a test can help and wait for, as the engine's BatchRecord does
// otherwise, for tests that drive a transport's link or executor directly.
#pragma once

#include <chrono>

#include "transport/batch_progress.h"

namespace kvferry::testing {

class TestBatch : public BatchProgress {
 public:
  using BatchProgress::BatchProgress;
  // What a thread about to wait does first: the batch's helpers' work.
  void help_now() { help(Clock::now() + std::chrono::seconds(10)); }
  BatchStatus wait_for_end(std::chrono::seconds limit) {
    wait_until(Clock::now() + limit);
    return snapshot();
  }
};

}  // namespace kvferry::testing
