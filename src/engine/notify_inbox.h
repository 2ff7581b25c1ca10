// NotifyInbox: the notifications a NotificationReceiver holds until the owner drains them
// (TransferEngine::get_notifications), bounded in entries and in bytes, with a share per
// sender so that one sender cannot take the room the others need.
//
// A sender is an identity, its name and incarnation (what its hello claims; with a secret,
// only a peer that proved it gets this far), not a connection. A sender that holds entries
// may add more only within its share of either bound: the bound divided by one more than
// the number of senders holding entries. So one sender alone holds at most half, and there
// is always room for another to arrive; once it has, the first one's share shrinks and it
// adds nothing until the owner drained it below. A sender that holds nothing may always add
// one entry the totals allow (a notification larger than a share still gets through).
// try_push never waits: the receiver stops reading a connection whose push was refused and
// retries after a drain, so a refused sender is held back, never dropped.
//
// An entry costs its bytes, names and bookkeeping (entry_cost). A connection may reserve the
// room for the kSenderLost entry it leaves if it ends without its goodbye: the reservation
// counts against the bounds and the sender's share like an entry, and push_reserved turns
// it into that entry without a check, so a lost sender's entry is never refused for room.
//
// Thread-safety: every method may be called from any thread (one mutex). A try_push that
// failed may succeed after a drain from another thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvferry/transfer_engine.h"

namespace kvferry::detail {

// The longest reason a kSenderLost entry gives (a longer one is cut).
inline constexpr size_t kMaxSenderLostReasonBytes = 256;

class NotifyInbox {
 public:
  struct Limits {
    size_t max_entries = 0;
    size_t max_bytes = 0;
  };
  enum class Outcome {
    kAdded,
    kOverShare,  // the sender holds its share: its connection should wait for a drain
    kFull,       // the totals have no room for it
  };
  struct Usage {
    size_t entries = 0;  // entries and reservations
    size_t bytes = 0;
    size_t senders = 0;  // senders holding entries or reservations
  };

  explicit NotifyInbox(Limits limits) : limits_(limits) {}

  // What `n` counts against max_bytes.
  static size_t entry_cost(const Notification& n);
  // What a reservation for a kSenderLost entry of this sender counts (its longest reason).
  static size_t lost_entry_cost(std::string_view sender, std::string_view sender_endpoint);

  // Adds `n` (moved from only on kAdded) and, when `reserve_bytes` > 0, a reservation of
  // one entry and that many bytes for the same sender, if the sender's share and the totals
  // have room for both.
  Outcome try_push(Notification& n, size_t reserve_bytes);
  // A reservation alone (entries: 1, bytes: `bytes`), under the same rules.
  Outcome try_reserve(const Notification& sender, size_t bytes);
  // Gives back a reservation the sender's connection no longer needs (it said goodbye).
  void release(const Notification& sender, size_t reserved_bytes);
  // Turns a reservation of `reserved_bytes` into `lost`, which must cost at most that.
  void push_reserved(Notification lost, size_t reserved_bytes);

  // Takes at most `max` entries, oldest first.
  std::vector<Notification> drain(size_t max);
  Usage usage() const;

 private:
  using SenderKey = std::pair<uint64_t, std::string>;  // incarnation, name
  struct Account {
    size_t entries = 0;
    size_t bytes = 0;
  };
  struct Entry {
    Notification notification;
    size_t cost = 0;
  };
  static SenderKey key_of(const Notification& n) { return {n.sender_incarnation, n.sender}; }
  Outcome admits_locked(const SenderKey& key, size_t entries, size_t bytes) const;
  void charge_locked(const SenderKey& key, size_t entries, size_t bytes);
  void refund_locked(const SenderKey& key, size_t entries, size_t bytes);

  const Limits limits_;
  mutable std::mutex mu_;
  std::deque<Entry> entries_;              // guarded by mu_
  std::map<SenderKey, Account> accounts_;  // guarded by mu_: senders holding something
  size_t held_entries_ = 0;                // guarded by mu_: entries_ and reservations
  size_t held_bytes_ = 0;                  // guarded by mu_
};

}  // namespace kvferry::detail
