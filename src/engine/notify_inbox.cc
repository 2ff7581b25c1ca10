#include "engine/notify_inbox.h"

#include <algorithm>

namespace kvferry::detail {

size_t NotifyInbox::entry_cost(const Notification& n) {
  return sizeof(Entry) + n.bytes.size() + n.sender.size() + n.sender_endpoint.size();
}

size_t NotifyInbox::lost_entry_cost(std::string_view sender, std::string_view sender_endpoint) {
  return sizeof(Entry) + kMaxSenderLostReasonBytes + sender.size() + sender_endpoint.size();
}

NotifyInbox::Outcome NotifyInbox::admits_locked(const SenderKey& key, size_t entries,
                                                size_t bytes) const {
  auto it = accounts_.find(key);
  if (it != accounts_.end()) {
    // Senders holding something, this one among them, and room for one more to arrive.
    const size_t shares = accounts_.size() + 1;
    const size_t share_entries = std::max<size_t>(1, limits_.max_entries / shares);
    const size_t share_bytes = limits_.max_bytes / shares;
    if (it->second.entries + entries > share_entries || it->second.bytes + bytes > share_bytes) {
      return Outcome::kOverShare;
    }
  }
  if (held_entries_ + entries > limits_.max_entries || held_bytes_ + bytes > limits_.max_bytes) {
    return Outcome::kFull;
  }
  return Outcome::kAdded;
}

void NotifyInbox::charge_locked(const SenderKey& key, size_t entries, size_t bytes) {
  Account& a = accounts_[key];
  a.entries += entries;
  a.bytes += bytes;
  held_entries_ += entries;
  held_bytes_ += bytes;
}

void NotifyInbox::refund_locked(const SenderKey& key, size_t entries, size_t bytes) {
  auto it = accounts_.find(key);
  if (it == accounts_.end()) return;
  it->second.entries -= std::min(entries, it->second.entries);
  it->second.bytes -= std::min(bytes, it->second.bytes);
  held_entries_ -= std::min(entries, held_entries_);
  held_bytes_ -= std::min(bytes, held_bytes_);
  if (it->second.entries == 0) accounts_.erase(it);
}

NotifyInbox::Outcome NotifyInbox::try_push(Notification& n, size_t reserve_bytes) {
  const size_t cost = entry_cost(n);
  const size_t entries = reserve_bytes > 0 ? 2 : 1;
  SenderKey key = key_of(n);
  std::lock_guard lock(mu_);
  const Outcome outcome = admits_locked(key, entries, cost + reserve_bytes);
  if (outcome != Outcome::kAdded) return outcome;
  charge_locked(key, entries, cost + reserve_bytes);
  entries_.push_back(Entry{std::move(n), cost});
  return outcome;
}

NotifyInbox::Outcome NotifyInbox::try_reserve(const Notification& sender, size_t bytes) {
  SenderKey key = key_of(sender);
  std::lock_guard lock(mu_);
  const Outcome outcome = admits_locked(key, 1, bytes);
  if (outcome == Outcome::kAdded) charge_locked(key, 1, bytes);
  return outcome;
}

void NotifyInbox::release(const Notification& sender, size_t reserved_bytes) {
  SenderKey key = key_of(sender);
  std::lock_guard lock(mu_);
  refund_locked(key, 1, reserved_bytes);
}

void NotifyInbox::push_reserved(Notification lost, size_t reserved_bytes) {
  const size_t cost = entry_cost(lost);
  SenderKey key = key_of(lost);
  std::lock_guard lock(mu_);
  // The entry takes the reservation's place; what it costs less is given back.
  refund_locked(key, 0, reserved_bytes - std::min(cost, reserved_bytes));
  entries_.push_back(Entry{std::move(lost), std::min(cost, reserved_bytes)});
}

std::vector<Notification> NotifyInbox::drain(size_t max) {
  std::vector<Notification> out;
  std::lock_guard lock(mu_);
  const size_t n = std::min(max, entries_.size());
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    Entry& e = entries_.front();
    refund_locked(key_of(e.notification), 1, e.cost);
    out.push_back(std::move(e.notification));
    entries_.pop_front();
  }
  return out;
}

NotifyInbox::Usage NotifyInbox::usage() const {
  std::lock_guard lock(mu_);
  return Usage{held_entries_, held_bytes_, accounts_.size()};
}

}  // namespace kvferry::detail
