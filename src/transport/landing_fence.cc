#include "transport/landing_fence.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace kvferry {
namespace {

// A thread's window count: odd while a window is open.
struct Slot {
  std::atomic<uint64_t> seq{0};
  int depth = 0;  // nesting; touched by the owning thread only
};

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<Slot>> slots;
};

Registry& registry() {
  static auto* r = new Registry;  // never destroyed: threads may end after static destructors
  return *r;
}

// Registered on the thread's first window, removed when the thread ends (never inside a
// window).
struct ThreadSlot {
  std::shared_ptr<Slot> slot = std::make_shared<Slot>();
  ThreadSlot() {
    std::lock_guard lock(registry().mu);
    registry().slots.push_back(slot);
  }
  ~ThreadSlot() {
    std::lock_guard lock(registry().mu);
    auto& slots = registry().slots;
    slots.erase(std::find(slots.begin(), slots.end(), slot));
  }
  ThreadSlot(const ThreadSlot&) = delete;
  ThreadSlot& operator=(const ThreadSlot&) = delete;
};

Slot& this_thread_slot() {
  thread_local ThreadSlot mine;
  return *mine.slot;
}

}  // namespace

LandingWindow::LandingWindow() : seq_(nullptr) {
  Slot& slot = this_thread_slot();
  if (slot.depth++ != 0) return;
  seq_ = &slot.seq;
  seq_->store(seq_->load(std::memory_order_relaxed) + 1, std::memory_order_seq_cst);
}

LandingWindow::~LandingWindow() {
  Slot& slot = this_thread_slot();
  --slot.depth;
  if (seq_ != nullptr) {
    seq_->store(seq_->load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
}

void wait_for_landings(const std::function<void(size_t open)>& found) {
  const Slot* own = &this_thread_slot();
  std::vector<std::pair<std::shared_ptr<Slot>, uint64_t>> open;
  {
    std::lock_guard lock(registry().mu);
    for (const auto& slot : registry().slots) {
      const uint64_t seq = slot->seq.load(std::memory_order_seq_cst);
      if (seq % 2 == 1 && slot.get() != own) open.emplace_back(slot, seq);
    }
  }
  if (found) found(open.size());
  for (const auto& [slot, seq] : open) {
    // A window is a receive or a copy: yield first, then sleep in short steps.
    for (int polls = 0; slot->seq.load(std::memory_order_acquire) == seq; ++polls) {
      if (polls < 100) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }
}

}  // namespace kvferry
